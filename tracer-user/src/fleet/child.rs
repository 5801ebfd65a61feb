//! One `tracer attach --exe IMAGE --json` per interpreter image: `--all`
//! runs tracer itself once per image, so that each image gets the plan,
//! probes, budget and exit handling `--exe` has, and reads what each one
//! says, line by line, as the model's events.

use std::{
    ffi::OsString,
    io::{BufRead as _, BufReader, Read as _},
    os::unix::process::CommandExt as _,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::Instant,
};

use tokio::sync::mpsc::UnboundedSender;

use crate::model::Event;

/// The most bytes of one line read from a child: a summary with stacks can
/// be large, but `--all` asks for none.
const MAX_LINE: usize = 16 << 20;

/// What a child said.
#[derive(Debug)]
pub enum Said {
    /// A line of its JSON.
    Event(usize, Box<Event>),
    /// A line of its stderr (an error, or its detach line).
    Stderr(usize, String),
    /// A line of its stdout that is not an event.
    Garbled(usize, String),
    /// Its stdout ended: it exited, or is about to.
    Closed(usize),
}

/// A running `tracer attach --exe`.
#[derive(Debug)]
pub struct Tracer {
    pub image: PathBuf,
    child: Child,
    /// When it was started.
    pub started: Instant,
}

impl Tracer {
    /// Starts `tracer attach --exe image --json` with `args` (the flags
    /// `--all` passes on), its lines going to `said` as number `index`.
    /// Where `held` is given, the image is that open file, which the child
    /// inherits and is given as `/proc/self/fd/N`: its path goes through a
    /// process that may end first. It runs in a process group of its own,
    /// so that only `--all` ends it (a terminal's Ctrl-C reaches `--all`,
    /// which ends each in turn and waits for its summary), and it is sent
    /// SIGTERM if `--all` dies.
    pub fn start(
        index: usize,
        (image, held): (&Path, Option<&std::fs::File>),
        args: &[OsString],
        said: &UnboundedSender<Said>,
    ) -> std::io::Result<Self> {
        let me = std::env::current_exe()?;
        let held = held.map(std::os::fd::AsRawFd::as_raw_fd);
        let exe = held.map_or_else(|| image.to_owned(), |fd| PathBuf::from(format!("/proc/self/fd/{fd}")));
        let mut command = Command::new(me);
        command
            .arg("attach")
            .arg("--exe")
            .arg(&exe)
            .arg("--json")
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0);
        // SAFETY: prctl and fcntl are async-signal-safe; the closure
        // allocates nothing and touches no lock between fork and exec; the
        // descriptor is the held file's, open for the whole call.
        unsafe {
            command.pre_exec(move || {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) == -1 {
                    return Err(std::io::Error::last_os_error());
                }
                // In the child only: the held image stays open across exec.
                if let Some(fd) = held
                    && libc::fcntl(fd, libc::F_SETFD, 0) == -1
                {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let mut child = command.spawn()?;
        let (Some(stdout), Some(stderr)) = (child.stdout.take(), child.stderr.take()) else {
            let _ = child.kill();
            return Err(std::io::Error::other("the child's pipes were not made"));
        };
        let out = said.clone();
        std::thread::spawn(move || {
            let mut reader = BufReader::new(stdout);
            let mut line = Vec::new();
            loop {
                line.clear();
                match (&mut reader).take(MAX_LINE as u64).read_until(b'\n', &mut line) {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {}
                }
                let text = String::from_utf8_lossy(&line);
                let said = match serde_json::from_str::<Event>(text.trim_end()) {
                    Ok(event) => Said::Event(index, Box::new(event)),
                    Err(e) => Said::Garbled(index, format!("{e}")),
                };
                if out.send(said).is_err() {
                    return;
                }
            }
            let _ = out.send(Said::Closed(index));
        });
        let err = said.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if err.send(Said::Stderr(index, line)).is_err() {
                    return;
                }
            }
        });
        Ok(Self { image: image.to_owned(), child, started: Instant::now() })
    }

    /// Asks it to end as Ctrl-C would: it detaches and prints its summary.
    pub fn interrupt(&self) {
        if let Ok(pid) = i32::try_from(self.child.id()) {
            // SAFETY: a plain signal to a child not yet reaped, whose PID
            // is therefore still its own.
            unsafe { libc::kill(pid, libc::SIGINT) };
        }
    }

    /// Kills it, when it did not end when asked.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
    }

    /// Its exit status, once it exited.
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// Waits for it to exit.
    pub fn wait(&mut self) -> Option<std::process::ExitStatus> {
        self.child.wait().ok()
    }
}

impl Drop for Tracer {
    /// A child left running would stay attached: never.
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}
