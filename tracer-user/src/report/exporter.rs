//! `--listen ADDR:PORT`: a Prometheus endpoint. [`MetricsReporter`] is a
//! sink beside the table or the JSON: it renders each interval (and the
//! summary) into the page that [`serve`] hands out at `/metrics`, plain
//! HTTP/1.x, one response per connection.

use std::{
    collections::HashMap,
    net::SocketAddr,
    sync::{
        Arc, Mutex,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use thiserror::Error;
use tokio::net::{TcpListener, TcpStream};

use super::{Reporter, prometheus};
use crate::{error::Classify, model::Event};

/// The address could not be listened on.
#[derive(Debug, Error)]
#[error("cannot listen on {addr} for --listen: {cause}; {}", hint(cause))]
pub struct ListenError {
    pub addr: SocketAddr,
    pub cause: std::io::Error,
}

/// The fix for a failed bind.
fn hint(cause: &std::io::Error) -> &'static str {
    match cause.kind() {
        std::io::ErrorKind::AddrNotAvailable => "pass an address of this host, or a bare port for 127.0.0.1",
        std::io::ErrorKind::PermissionDenied => "pick a port above 1023",
        _ => "pick a free port (e.g. --listen 127.0.0.1:9464)",
    }
}

impl Classify for ListenError {
    fn is_bad_input(&self) -> bool {
        true
    }
}

/// The page served, shared between the reporter and the server.
pub type Page = Arc<Mutex<String>>;

/// Binds `addr` now, before anything is attached, so that a port in use is
/// the user's error and nothing is left attached.
pub fn bind(addr: SocketAddr) -> Result<std::net::TcpListener, ListenError> {
    let listener = std::net::TcpListener::bind(addr).map_err(|cause| ListenError { addr, cause })?;
    listener.set_nonblocking(true).map_err(|cause| ListenError { addr, cause })?;
    Ok(listener)
}

/// The most connections served at once: more are closed at once, so that
/// a flood of them cannot take tracer's file descriptors.
const MAX_CONNECTIONS: usize = 16;

/// Serves `page` on `listener` from a thread of its own (`metrics`), with
/// a runtime of its own, until tracer exits: a scrape is answered at once
/// with the page as it is, whatever the run loop is doing (the attach
/// planning an LTO build's 1,400 sites, a window's probes going live),
/// never held past a scraper's timeout. The thread holds no capability:
/// it only accepts on the socket already bound. Until the attach, the page
/// says only that tracer attaches to `pid` ([`prometheus::attaching`]);
/// the page returned is the one a [`MetricsReporter`] keeps up to date.
pub fn serve(listener: std::net::TcpListener, pid: Option<u32>) -> std::io::Result<Page> {
    let page = Arc::new(Mutex::new(prometheus::attaching(pid)));
    let runtime = tokio::runtime::Builder::new_current_thread().enable_io().enable_time().build()?;
    let listener = {
        let _entered = runtime.enter();
        TcpListener::from_std(listener)?
    };
    let served = Arc::clone(&page);
    std::thread::Builder::new().name("metrics".to_owned()).spawn(move || {
        // It needs none; where the kernel refuses the drop, it serves
        // all the same.
        let _ = crate::capabilities::keep_only(0);
        runtime.block_on(accept(listener, served));
    })?;
    Ok(page)
}

/// Accepts connections on `listener` and answers each with `page`.
async fn accept(listener: TcpListener, page: Page) {
    let open = Arc::new(AtomicUsize::new(0));
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            // Out of descriptors, say: not a busy loop.
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        if open.fetch_add(1, Ordering::SeqCst) >= MAX_CONNECTIONS {
            open.fetch_sub(1, Ordering::SeqCst);
            drop(stream);
            continue;
        }
        let (page, open) = (Arc::clone(&page), Arc::clone(&open));
        tokio::spawn(async move {
            // A slow or silent client is answered 408 after
            // REQUEST_TIMEOUT, and one that will not read its answer
            // dropped after this.
            let _ = tokio::time::timeout(REQUEST_TIMEOUT + Duration::from_secs(5), respond(stream, &page)).await;
            open.fetch_sub(1, Ordering::SeqCst);
        });
    }
}

/// The longest request head read.
const MAX_REQUEST: usize = 8 * 1024;

/// How long a client may take to send its request head: a connection that
/// sends nothing holds one of the [`MAX_CONNECTIONS`] until then.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(3);

/// How a request head ended.
enum Head {
    /// Read whole (or the client stopped sending).
    Read,
    /// Longer than [`MAX_REQUEST`].
    TooLong,
    /// Not whole within [`REQUEST_TIMEOUT`].
    TimedOut,
}

/// How much of a head over [`MAX_REQUEST`] is read and dropped before the
/// refusal: a client that sent it whole then reads the answer (closing
/// with its bytes unread would reset the connection under it).
const MAX_DRAIN: usize = 64 * 1024;

/// Where the head in `request` ends (after its blank line), if it does.
fn head_end(request: &[u8]) -> Option<usize> {
    let crlf = request.windows(4).position(|w| w == b"\r\n\r\n").map(|i| i + 4);
    let lf = request.windows(2).position(|w| w == b"\n\n").map(|i| i + 2);
    crlf.into_iter().chain(lf).min()
}

/// Reads a request head into `request`.
async fn read_head(stream: &TcpStream, request: &mut Vec<u8>) -> std::io::Result<Head> {
    let mut buf = [0u8; 1024];
    // Once the head is over MAX_REQUEST: how much more was read and
    // dropped.
    let mut drained: Option<usize> = None;
    loop {
        stream.readable().await?;
        let n = match stream.try_read(&mut buf) {
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e),
        };
        if n == 0 {
            // The client stopped sending: what came is the head.
            return Ok(if drained.is_some() { Head::TooLong } else { Head::Read });
        }
        request.extend_from_slice(&buf[..n]);
        match (drained.as_mut(), head_end(request)) {
            (None, Some(end)) => return Ok(if end <= MAX_REQUEST { Head::Read } else { Head::TooLong }),
            (None, None) if request.len() > MAX_REQUEST => drained = Some(n),
            (None, None) => continue,
            (Some(_), Some(_)) => return Ok(Head::TooLong),
            (Some(so_far), None) => *so_far += n,
        }
        // Only the last bytes are kept, to see where the head ends.
        request.drain(..request.len().saturating_sub(3));
        if drained.is_some_and(|so_far| so_far > MAX_DRAIN) {
            return Ok(Head::TooLong);
        }
    }
}

async fn respond(stream: TcpStream, page: &Page) -> std::io::Result<()> {
    let mut request = Vec::new();
    let head =
        tokio::time::timeout(REQUEST_TIMEOUT, read_head(&stream, &mut request)).await.unwrap_or(Ok(Head::TimedOut))?;
    let text = String::from_utf8_lossy(&request);
    let mut words = text.lines().next().unwrap_or_default().split_whitespace();
    let (method, path) = (words.next().unwrap_or_default(), words.next().unwrap_or_default());
    let path = path.split('?').next().unwrap_or_default();
    let plain = "text/plain; charset=utf-8";
    let (status, kind, body) = match (head, method, path) {
        (Head::TooLong, ..) => {
            ("431 Request Header Fields Too Large", plain, format!("a request head is at most {MAX_REQUEST} bytes\n"))
        }
        (Head::TimedOut, ..) => {
            ("408 Request Timeout", plain, format!("no request head within {} s\n", REQUEST_TIMEOUT.as_secs()))
        }
        (Head::Read, "GET" | "HEAD", "/metrics") => {
            let text = page.lock().map(|p| p.clone()).unwrap_or_default();
            ("200 OK", "text/plain; version=0.0.4; charset=utf-8", text)
        }
        (Head::Read, "GET" | "HEAD", _) => ("404 Not Found", plain, "tracer serves /metrics only\n".to_owned()),
        (Head::Read, ..) => ("405 Method Not Allowed", plain, "GET /metrics\n".to_owned()),
    };
    let mut response = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {kind}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    if method != "HEAD" {
        response.push_str(&body);
    }
    let mut rest = response.as_bytes();
    while !rest.is_empty() {
        stream.writable().await?;
        match stream.try_write(rest) {
            Ok(n) => rest = &rest[n..],
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
    }
    // Dropping the stream closes it: the client reads to the end.
    Ok(())
}

/// The sink that keeps the page up to date, passing every event on to the
/// report it stands beside.
pub struct MetricsReporter<'a> {
    inner: Box<dyn Reporter + 'a>,
    page: Page,
    attached: Option<crate::model::Attached>,
    /// Each process's cgroup, read once.
    containers: HashMap<u32, String>,
}

impl<'a> MetricsReporter<'a> {
    #[must_use]
    pub fn new(inner: Box<dyn Reporter + 'a>, page: Page) -> Self {
        Self { inner, page, attached: None, containers: HashMap::new() }
    }

    /// The page of `snapshot`; `live` while the probes are (an interval),
    /// not once detached (the summary).
    fn update(&mut self, snapshot: &crate::model::Snapshot, live: bool) {
        let Some(attached) = &self.attached else { return };
        let containers = &mut self.containers;
        for pid in attached.pid.into_iter().chain(snapshot.pids.keys().filter_map(|p| p.parse().ok())) {
            containers.entry(pid).or_insert_with(|| prometheus::cgroup_of(pid));
        }
        let container = |pid| containers.get(&pid).cloned().unwrap_or_default();
        let text = prometheus::render(attached, snapshot, live, &container);
        if let Ok(mut page) = self.page.lock() {
            *page = text;
        }
    }
}

impl Reporter for MetricsReporter<'_> {
    fn event(&mut self, event: &Event) -> std::io::Result<()> {
        self.inner.event(event)?;
        match event {
            Event::Attached(a) => {
                self.attached = Some(a.clone());
                self.update(&crate::model::Snapshot::default(), true);
            }
            Event::Interval(s) => self.update(s, true),
            Event::Summary(s) => self.update(&s.snapshot, false),
            Event::Note(_) => {}
        }
        Ok(())
    }
}
