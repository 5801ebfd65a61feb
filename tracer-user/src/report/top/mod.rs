//! `tracer top`: the run's model drawn full-screen in the terminal, each
//! interval, with ratatui. A thread of its own owns the terminal: it
//! draws what the run loop sends it and reads the keys. q or Ctrl-C (the
//! terminal is in raw mode, so Ctrl-C arrives as a key) sends tracer the
//! SIGINT the run loop already ends on, so that quitting detaches exactly
//! as `tracer attach` does; the summary (or the reporter dropped on an
//! error) ends the thread, which restores the terminal before tracer
//! prints anything else. Notes given while the screen is up are shown on
//! its last line, and every one of them printed on stderr once it is gone
//! (the files written at the end, the port `--listen` took).

mod fit;
mod view;

use std::{
    io::{self, Write},
    sync::mpsc::{self, Receiver, Sender, TryRecvError},
    thread::JoinHandle,
    time::Duration,
};

use ratatui::crossterm::event::{self, Event as TermEvent};

use self::view::{Action, View};
use super::Reporter;
use crate::model::{Event, Note};

/// What the run loop sends the screen.
enum Message {
    Snapshot(Box<crate::model::Snapshot>),
    Note(String),
    /// The run ended: restore the terminal and stop.
    Done,
}

/// The screen's thread, once the probes are attached.
struct Screen {
    sender: Sender<Message>,
    thread: JoinHandle<io::Result<()>>,
}

/// The reporter of `tracer top`.
pub struct TopReporter<'a> {
    /// stderr: notes before the screen is up, and those given while it
    /// was, once it is gone.
    err: Box<dyn Write + 'a>,
    screen: Option<Screen>,
    /// Notes given while the screen was up.
    notes: Vec<Note>,
}

impl<'a> TopReporter<'a> {
    #[must_use]
    pub fn new(err: Box<dyn Write + 'a>) -> Self {
        Self { err, screen: None, notes: Vec::new() }
    }

    /// Ends the screen's thread (the terminal restored), then prints the
    /// notes it showed.
    fn close(&mut self) -> io::Result<()> {
        let Some(screen) = self.screen.take() else { return Ok(()) };
        // The thread may have ended already (a terminal error): then the
        // send fails, and its result says why.
        let _ = screen.sender.send(Message::Done);
        let drawn = screen.thread.join().unwrap_or_else(|_| Err(io::Error::other("its thread panicked")));
        for note in std::mem::take(&mut self.notes) {
            super::note_line(&mut self.err, &note)?;
        }
        drawn.map_err(|e| {
            io::Error::other(format!(
                "tracer top's screen failed ({e}); the run ended and nothing is attached: use `tracer attach` with the same flags for a report that needs no terminal"
            ))
        })
    }
}

impl Reporter for TopReporter<'_> {
    fn event(&mut self, event: &Event) -> io::Result<()> {
        match event {
            Event::Attached(attached) => {
                let view = View::new(attached);
                let (sender, receiver) = mpsc::channel();
                let thread =
                    std::thread::Builder::new().name("tracer-top".to_owned()).spawn(move || draw(view, &receiver))?;
                self.screen = Some(Screen { sender, thread });
            }
            Event::Interval(snapshot) => self.send(Message::Snapshot(Box::new(snapshot.clone())))?,
            Event::Note(note) => {
                if self.screen.is_none() {
                    return super::note_line(&mut self.err, note);
                }
                self.notes.push(note.clone());
                self.send(Message::Note(note.message.clone()))?;
            }
            Event::Summary(_) => self.close()?,
        }
        Ok(())
    }
}

impl TopReporter<'_> {
    /// Sends the screen `message`; if its thread has ended, its error.
    fn send(&mut self, message: Message) -> io::Result<()> {
        let Some(screen) = &self.screen else { return Ok(()) };
        if screen.sender.send(message).is_err() {
            // Only an error ends the thread before `Done`: close says which.
            return self.close().and(Err(io::Error::other(
                "tracer top's screen ended; the run ended and nothing is attached: use `tracer attach` with the same flags for a report that needs no terminal",
            )));
        }
        Ok(())
    }
}

impl Drop for TopReporter<'_> {
    /// A run that ends on an error drops the reporter without a summary:
    /// the terminal is restored all the same.
    fn drop(&mut self) {
        let _ = self.close();
    }
}

/// How long the screen waits for a key before it looks for the run's
/// messages again: ten wake-ups a second, each a few microseconds.
const TICK: Duration = Duration::from_millis(100);

/// The screen's thread: takes the terminal, draws `view` as messages and
/// keys change it, and restores the terminal when the run ends.
fn draw(mut view: View, messages: &Receiver<Message>) -> io::Result<()> {
    // Drawing needs no capability; this thread starts before the main
    // thread drops its own, and cannot be narrowed from there.
    crate::capabilities::keep_only(0).map_err(io::Error::other)?;
    // try_init takes raw mode before the alternate screen: where a later
    // step fails, what it took is given back.
    let mut terminal = match ratatui::try_init() {
        Ok(terminal) => terminal,
        Err(e) => {
            let _ = ratatui::try_restore();
            return Err(e);
        }
    };
    let drawn = (|| {
        let mut dirty = true;
        loop {
            if dirty {
                terminal.draw(|frame| view.draw(frame))?;
                dirty = false;
            }
            loop {
                match messages.try_recv() {
                    Ok(Message::Snapshot(s)) => view.update(*s),
                    Ok(Message::Note(n)) => view.note(&n),
                    Ok(Message::Done) | Err(TryRecvError::Disconnected) => return Ok(()),
                    Err(TryRecvError::Empty) => break,
                }
                dirty = true;
            }
            if dirty {
                continue;
            }
            // A key wakes the screen at once; then every key waiting.
            let mut waited = TICK;
            while event::poll(waited)? {
                waited = Duration::ZERO;
                match event::read()? {
                    TermEvent::Key(key) => match view.key(key) {
                        Action::Quit if !view.quitting => {
                            view.quitting = true;
                            dirty = true;
                            // SAFETY: kill with our own PID and a valid
                            // signal number has no memory effects; the run
                            // loop's SIGINT handler ends the run.
                            unsafe { libc::kill(libc::getpid(), libc::SIGINT) };
                        }
                        Action::Redraw => dirty = true,
                        Action::Quit | Action::None => {}
                    },
                    TermEvent::Resize(..) => dirty = true,
                    _ => {}
                }
            }
        }
    })();
    let restored = ratatui::try_restore();
    drop(terminal);
    drawn.and(restored)
}
