//! `--listen`: the Prometheus endpoint serves the model's figures, exactly
//! those of the interval it last reported, names from the target escaped.

use std::{
    collections::HashMap,
    io::{Read as _, Write as _},
    net::TcpStream,
    time::{Duration, Instant},
};

use serde_json::Value;

use tracer_tests::{TracerRun, Workload, counts, require_root, run_tracer, shared_python};

/// Reads tracer's JSON lines up to its note of where it serves, and
/// returns that address.
fn serving(tracer: &TracerRun) -> String {
    loop {
        let line = tracer.stdout.next_line("the --listen note").expect("tracer ended before serving");
        let v: Value = serde_json::from_str(&line).expect("JSON");
        if v["type"] == "note" && v["code"] == "metrics" {
            let message = v["message"].as_str().expect("message");
            let url = message.rsplit(' ').next().expect("a URL");
            return url.trim_start_matches("http://").trim_end_matches("/metrics").to_owned();
        }
    }
}

/// `GET path` from `addr`: the status line and the body.
fn get(addr: &str, path: &str) -> (String, String) {
    let mut stream = TcpStream::connect(addr).expect("connect");
    stream.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
    write!(stream, "GET {path} HTTP/1.1\r\nHost: {addr}\r\n\r\n").expect("request");
    let mut response = String::new();
    stream.read_to_string(&mut response).expect("response");
    let (head, body) = response.split_once("\r\n\r\n").expect("a head and a body");
    (head.lines().next().unwrap_or_default().to_owned(), body.to_owned())
}

/// The samples of a page: `name{labels}` -> value as written; and every
/// line must be a comment or a sample of tracer's, its value a number.
fn samples(page: &str) -> HashMap<String, String> {
    let mut out = HashMap::new();
    for line in page.lines() {
        if line.starts_with("# HELP tracer_") || line.starts_with("# TYPE tracer_") {
            // Each family's HELP and TYPE once.
            let family = line.split_whitespace().take(3).collect::<Vec<_>>().join(" ");
            assert!(out.insert(family, String::new()).is_none(), "twice: {line}");
            continue;
        }
        assert!(line.starts_with("tracer_"), "not a sample of tracer's: {line:?}");
        let (series, value) = line.rsplit_once(' ').expect("a value");
        assert!(value == "NaN" || value.parse::<f64>().is_ok(), "not a number: {line}");
        assert!(out.insert(series.to_owned(), value.to_owned()).is_none(), "a series twice: {series}");
    }
    out
}

/// The page as the `prometheus_client` package's text-format parser reads
/// it (Debian's python3-prometheus-client, which `cargo xtask setup`
/// installs): every sample as (name, labels, value). A page it rejects
/// fails the test with its error.
fn parsed(page: &str) -> Vec<(String, HashMap<String, String>, f64)> {
    const PARSE: &str = "import json, sys\n\
        from prometheus_client.parser import text_string_to_metric_families as families\n\
        print(json.dumps([[s.name, s.labels, repr(s.value)] for f in families(sys.stdin.read()) for s in f.samples]))";
    let mut child = std::process::Command::new("/usr/bin/python3")
        .args(["-c", PARSE])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("/usr/bin/python3: run `cargo xtask setup`");
    child.stdin.take().expect("stdin").write_all(page.as_bytes()).expect("the page to the parser");
    let out = child.wait_with_output().expect("the parser");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !err.contains("No module named 'prometheus_client'"),
        "prometheus_client is missing: run `cargo xtask setup`"
    );
    assert!(out.status.success(), "prometheus_client rejects the page: {err}\n{page}");
    // Each value as Python's repr, its shortest exact form, which Rust's
    // parser reads back exactly (serde_json's own may miss by a unit).
    let all: Vec<(String, HashMap<String, String>, String)> =
        serde_json::from_slice(&out.stdout).expect("the parser's JSON");
    all.into_iter()
        .map(|(name, labels, value)| {
            let value = value.parse().unwrap_or_else(|_| panic!("{name}: {value} is not a number"));
            (name, labels, value)
        })
        .collect()
}

/// The value `prometheus_client` read for `name` with `labels` (and no
/// other label).
fn parsed_value(parsed: &[(String, HashMap<String, String>, f64)], name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    let want: HashMap<String, String> = labels.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
    let mut found = parsed.iter().filter(|(n, l, _)| n == name && *l == want);
    let value = found.next().map(|(_, _, v)| *v);
    assert!(found.next().is_none(), "{name} {labels:?} twice");
    value
}

/// A sample's value as a number (a HELP or TYPE line has none).
fn value(scraped: &HashMap<String, String>, series: &str) -> Option<f64> {
    scraped.get(series).map(|v| v.parse().unwrap_or(f64::NAN))
}

#[test]
fn the_endpoint_serves_the_interval_it_reported_exactly() {
    require_root();
    let python = shared_python();
    let mut workload = Workload::script(None, python.to_str().unwrap(), "threads.py", &["2", "10000"]);
    workload.wait_blocked_on_stdin();
    let pid = workload.pid();
    let container = cgroup(pid);
    let base = format!("pid=\"{pid}\",container=\"{container}\"");
    let (tracer, attached) = TracerRun::attach_json(pid, &["--interval", "0.2", "--listen", "127.0.0.1:0"]);
    assert_eq!(attached["mode"], "exact");
    assert!(attached["measures_bytes"].as_array().is_some_and(|m| !m.is_empty()), "{attached}");
    let addr = serving(&tracer);
    assert!(addr.starts_with("127.0.0.1:"), "{addr}");
    workload.go();
    workload.expect("done");
    workload.wait_blocked_reading(Some(5));
    // Intervals after the work: the counts no longer move.
    std::thread::sleep(Duration::from_millis(700));
    let (status, page) = get(&addr, "/metrics");
    assert_eq!(status, "HTTP/1.1 200 OK");
    let scraped = samples(&page);
    assert_eq!(get(&addr, "/other").0, "HTTP/1.1 404 Not Found");
    // A request head over 8 KiB is refused, not read on.
    let mut stream = TcpStream::connect(&addr).expect("connect");
    stream.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
    let _ = write!(stream, "GET /metrics HTTP/1.1\r\nX-Long: {}\r\n\r\n", "a".repeat(9000));
    let mut response = String::new();
    let _ = stream.read_to_string(&mut response);
    assert!(response.starts_with("HTTP/1.1 431 Request Header Fields Too Large\r\n"), "{response}");
    // A client that sends nothing is answered 408 (after 3 s), not waited for.
    let mut silent = TcpStream::connect(&addr).expect("connect");
    silent.set_read_timeout(Some(Duration::from_secs(20))).expect("timeout");
    let mut response = String::new();
    let _ = silent.read_to_string(&mut response);
    assert!(response.starts_with("HTTP/1.1 408 Request Timeout\r\n"), "{response}");
    tracer.signal(libc::SIGINT);
    let (status, lines, stderr) = tracer.finish();
    assert!(status.success(), "{stderr}");
    workload.close();
    // A real client's parser reads as many samples, and the same values.
    let by_client = parsed(&page);
    assert_eq!(by_client.len(), scraped.values().filter(|v| !v.is_empty()).count(), "{page}");
    let pid_s = pid.to_string();
    let labels = [("pid", pid_s.as_str()), ("container", container.as_str())];
    let elapsed = value(&scraped, &format!("tracer_elapsed_seconds{{{base}}}")).expect("elapsed");
    assert_eq!(parsed_value(&by_client, "tracer_elapsed_seconds", &labels), Some(elapsed));
    // The interval the page was rendered from, by its time.
    let interval = lines
        .iter()
        .find(|l| l["type"] == "interval" && l["elapsed_s"].as_f64() == Some(elapsed))
        .unwrap_or_else(|| panic!("no interval at {elapsed} s"));
    let summary = lines.last().expect("summary");
    for (function, (calls, bytes)) in counts(interval) {
        let series = |name: &str| format!("{name}{{{base},function=\"{function}\"}}");
        // The page's values are the counts, written as integers.
        assert_eq!(scraped[&series("tracer_calls_total")], calls.to_string(), "{function}");
        // Bytes only of the functions whose bytes are measured: no 0 for
        // what is not known.
        let measured = attached["measures_bytes"].as_array().is_some_and(|m| m.iter().any(|f| f == &function));
        let bytes = measured.then(|| bytes.to_string());
        assert_eq!(scraped.get(&series("tracer_requested_bytes_total")), bytes.as_ref(), "{function}");
        let mut with_function = labels.to_vec();
        with_function.push(("function", function.as_str()));
        #[allow(clippy::cast_precision_loss, reason = "the counts here are far below 2^53")]
        let calls_f = calls as f64;
        assert_eq!(parsed_value(&by_client, "tracer_calls_total", &with_function), Some(calls_f), "{function}");
        // Nothing moved after the work: the summary says the same.
        assert_eq!(calls, counts(summary)[&function].0, "{function}");
    }
    // Two threads made 10,000 bytearrays each.
    let malloc = value(&scraped, &format!("tracer_calls_total{{{base},function=\"PyObject_Malloc\"}}"));
    assert!(malloc.is_some_and(|m| m >= 20_000.0), "{malloc:?}");
    for g in ["0", "1", "2"] {
        assert!(scraped.contains_key(&format!("tracer_gc_collections_total{{{base},generation=\"{g}\"}}")), "{page}");
    }
    assert!(page.contains("# TYPE tracer_calls_total counter\n"), "{page}");
    assert_eq!(
        scraped.get(&format!("tracer_missed_total{{{base},cause=\"map_full\"}}")).map(String::as_str),
        Some("0")
    );
}

fn cgroup(pid: u32) -> String {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).expect("cgroup");
    let line = text.lines().find(|l| l.starts_with("0::")).or_else(|| text.lines().next()).expect("a line");
    line.splitn(3, ':').nth(2).expect("a path").to_owned()
}

#[test]
fn the_heap_census_is_served_with_names_escaped() {
    require_root();
    let n = 5_000;
    let python = shared_python();
    let mut workload = Workload::script(None, python.to_str().unwrap(), "metrics.py", &[&n.to_string()]);
    workload.wait_blocked_on_stdin();
    let pid = workload.pid();
    let (tracer, attached) =
        TracerRun::profile_json(pid, &["--interval", "0.5", "--listen", "127.0.0.1:0", "--budget", "20"]);
    assert_eq!(attached["mode"], "profile");
    let addr = serving(&tracer);
    let container = cgroup(pid);
    let base = format!("pid=\"{pid}\",container=\"{container}\"");
    let deadline = Instant::now() + Duration::from_mins(1);
    let (page, scraped) = loop {
        let (_, page) = get(&addr, "/metrics");
        let scraped = samples(&page);
        if value(&scraped, &format!("tracer_heap_census{{{base}}}")).is_some_and(|c| c >= 1.0) {
            break (page, scraped);
        }
        assert!(Instant::now() < deadline, "no census served: {page}");
        std::thread::sleep(Duration::from_millis(200));
    };
    tracer.signal(libc::SIGINT);
    let (status, lines, stderr) = tracer.finish();
    assert!(status.success(), "{stderr}");
    workload.go();
    // The census's own name for the class, from the JSON.
    let census = lines.iter().find_map(|l| l["heap"]["types"].as_array()).expect("a census in the JSON");
    let weird = census
        .iter()
        .find(|t| t["name"].as_str().is_some_and(|n| n.contains("ird")))
        .unwrap_or_else(|| panic!("no weird type: {census:?}"));
    let name = weird["name"].as_str().expect("name");
    assert_eq!(name, "__main__.we\"ird\\x\n\x1b[31mname", "the census's own name");
    // The format's escapes for the quote, the backslash and the newline,
    // and the terminal escape replaced.
    let series = format!("tracer_heap_objects{{{base},type=\"__main__.we\\\"ird\\\\x\\n?[31mname\"}}");
    assert_eq!(scraped.get(&series), Some(&n.to_string()), "{series} in {page}");
    assert!(!page.contains('\x1b'), "a raw escape in the page");
    // A real client's parser unescapes it to the name with the terminal
    // escape replaced, and reads the same count.
    let pid_s = pid.to_string();
    let labels =
        [("pid", pid_s.as_str()), ("container", container.as_str()), ("type", "__main__.we\"ird\\x\n?[31mname")];
    assert_eq!(parsed_value(&parsed(&page), "tracer_heap_objects", &labels), Some(f64::from(n)), "{page}");
    // Capped: at most 30 types, the rest in a family of their own.
    let types = scraped.keys().filter(|k| k.starts_with("tracer_heap_objects{")).count();
    assert!(types <= 30, "{types} type series");
    let other = value(&scraped, &format!("tracer_heap_other_objects{{{base}}}"));
    assert!(other.is_some_and(|o| o > 0.0), "{page}");
}

#[test]
fn a_bad_or_busy_address_is_refused_before_anything_is_attached() {
    require_root();
    let (code, _, err) = run_tracer(&["attach", "--pid", "1", "--listen", "nope"]);
    assert_eq!(code, Some(2));
    assert_eq!(
        err,
        "tracer: error: --listen \"nope\" is neither a port nor an address and port; pass e.g. 9464 (127.0.0.1 only) or 0.0.0.0:9464\n"
    );
    let busy = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = busy.local_addr().expect("addr").port();
    let python = shared_python();
    let mut workload = Workload::script(None, python.to_str().unwrap(), "metrics.py", &["10"]);
    let pid = workload.pid().to_string();
    let (code, out, err) = run_tracer(&["attach", "--pid", &pid, "--listen", &port.to_string()]);
    assert_eq!((code, out.as_str()), (Some(2), ""));
    assert_eq!(
        err,
        format!(
            "tracer: error: cannot listen on 127.0.0.1:{port} for --listen: Address already in use (os error 98); pick a free port (e.g. --listen 127.0.0.1:9464)\n"
        )
    );
    workload.go();
}

/// A port free now, for a `--listen` that must be known before tracer
/// says where it serves.
fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.local_addr().expect("addr").port()
}

/// A scrape while tracer's run loop cannot serve it (here held opening
/// its `--record`, a FIFO nobody reads yet, at its first event, after the
/// probes went live) is answered at once from the metrics thread, with
/// `tracer_attached 0` alone; once the loop goes on, with the figures and
/// `tracer_attached 1`. A scrape held by the loop (as before) would hit
/// the read timeout, Prometheus' default scrape timeout of 10 s.
#[test]
fn a_scrape_is_answered_while_the_run_loop_is_busy() {
    require_root();
    let python = shared_python();
    let mut workload = Workload::script(None, python.to_str().unwrap(), "metrics.py", &["10"]);
    workload.wait_blocked_on_stdin();
    let pid = workload.pid();
    let dir = std::env::temp_dir().join(format!("tracer-prometheus-fifo-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch dir");
    let fifo = dir.join("record.fifo");
    let c_path = std::ffi::CString::new(fifo.to_str().expect("UTF-8")).expect("no NUL");
    // SAFETY: mkfifo reads the NUL-terminated path, which outlives the call.
    assert_eq!(unsafe { libc::mkfifo(c_path.as_ptr(), 0o600) }, 0, "mkfifo");
    let addr = format!("127.0.0.1:{}", free_port());
    let fifo_s = fifo.to_str().expect("UTF-8");
    // --force: the FIFO exists. The JSON's attached line comes before
    // the record is opened, which blocks until the FIFO has a reader.
    let (tracer, attached) =
        TracerRun::profile_json(pid, &["--interval", "0.3", "--listen", &addr, "--record", fifo_s, "--force"]);
    assert_eq!(attached["type"], "attached");
    let (status, page) = get(&addr, "/metrics");
    assert_eq!(status, "HTTP/1.1 200 OK");
    let container = cgroup(pid);
    assert_eq!(
        page,
        format!(
            "# HELP tracer_attached 1 while tracer's probes are live and the page holds the latest interval; 0 while it attaches (no figure yet) and once it has detached (the page holds the run's summary).\n\
             # TYPE tracer_attached gauge\n\
             tracer_attached{{pid=\"{pid}\",container=\"{container}\"}} 0\n"
        )
    );
    // The reader lets the loop go on.
    let reader = std::thread::spawn(move || std::fs::read_to_string(&fifo).expect("the record"));
    let deadline = Instant::now() + Duration::from_mins(1);
    let scraped = loop {
        let scraped = samples(&get(&addr, "/metrics").1);
        if value(&scraped, &format!("tracer_attached{{pid=\"{pid}\",container=\"{container}\"}}")) == Some(1.0)
            && value(&scraped, &format!("tracer_elapsed_seconds{{pid=\"{pid}\",container=\"{container}\"}}"))
                .is_some_and(|e| e > 0.0)
        {
            break scraped;
        }
        assert!(Instant::now() < deadline, "tracer_attached never 1: {scraped:?}");
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(scraped.keys().any(|k| k.starts_with("tracer_info{")), "{scraped:?}");
    tracer.signal(libc::SIGINT);
    let (status, _, stderr) = tracer.finish();
    assert!(status.success(), "{stderr}");
    let record = reader.join().expect("the reader");
    assert!(record.starts_with("{\"type\":\"attached\""), "{record}");
    workload.go();
    let _ = std::fs::remove_dir_all(&dir);
}

/// Growth at a site named with a quote, a backslash, a newline and a
/// terminal escape: the page's growth total, its 95% interval and the
/// site's are the JSON interval's of the same `elapsed_s`, exactly, and
/// the Prometheus client's parser reads the site's labels back as its
/// function and file (the escape replaced by `?`).
#[test]
fn growth_is_served_with_its_intervals_and_hostile_sites_escaped() {
    require_root();
    let python = shared_python();
    let mut workload = Workload::script(None, python.to_str().unwrap(), "metrics_growth.py", &["48"]);
    workload.wait_blocked_on_stdin();
    let pid = workload.pid();
    let (tracer, attached) =
        TracerRun::profile_json(pid, &["--interval", "0.5", "--listen", "127.0.0.1:0", "--growth"]);
    assert_eq!(attached["mode"], "profile");
    let addr = serving(&tracer);
    workload.tell("grow");
    workload.expect("grown");
    let container = cgroup(pid);
    let base = format!("pid=\"{pid}\",container=\"{container}\"");
    let total = format!("tracer_growth_total_in_use_bytes{{{base}}}");
    let deadline = Instant::now() + Duration::from_mins(1);
    let page = loop {
        let (_, page) = get(&addr, "/metrics");
        if value(&samples(&page), &total).is_some_and(|t| t > 0.0) {
            break page;
        }
        assert!(Instant::now() < deadline, "no growth served: {page}");
        std::thread::sleep(Duration::from_millis(200));
    };
    tracer.signal(libc::SIGINT);
    let (status, lines, stderr) = tracer.finish();
    assert!(status.success(), "{stderr}");
    workload.close();
    let scraped = samples(&page);
    let elapsed = value(&scraped, &format!("tracer_elapsed_seconds{{{base}}}")).expect("elapsed");
    let interval = lines
        .iter()
        .find(|l| l["type"] == "interval" && l["elapsed_s"].as_f64() == Some(elapsed))
        .unwrap_or_else(|| panic!("no interval at {elapsed} s"));
    let growth = &interval["growth"];
    assert_eq!(value(&scraped, &total), growth["in_use_bytes"].as_f64(), "{growth}");
    let bound =
        |name: &str, labels: &str, bound: &str| value(&scraped, &format!("{name}{{{labels},bound=\"{bound}\"}}"));
    let ci95 = &growth["in_use_ci95"];
    assert_eq!(bound("tracer_growth_total_in_use_bytes_ci95", &base, "lower"), ci95[0].as_f64(), "{growth}");
    assert_eq!(bound("tracer_growth_total_in_use_bytes_ci95", &base, "upper"), ci95[1].as_f64(), "{growth}");
    // The hostile site, as the JSON names it and the parser reads it.
    let site = growth["sites"]
        .as_array()
        .expect("sites")
        .iter()
        .find(|s| s["function"].as_str().is_some_and(|f| f.contains("ow")))
        .unwrap_or_else(|| panic!("no grow site: {growth}"));
    assert_eq!(site["function"], "gr\"ow\\x\n\x1b[31mname", "{site}");
    assert_eq!(site["file"], "/srv/ev\"il\\x\n\x1b[31m.py", "{site}");
    assert!(!page.contains('\x1b'), "a raw escape in the page");
    let pid_s = pid.to_string();
    let line = site["line"].as_u64().expect("a line").to_string();
    let labels = [
        ("pid", pid_s.as_str()),
        ("container", container.as_str()),
        ("function", "gr\"ow\\x\n?[31mname"),
        ("file", "/srv/ev\"il\\x\n?[31m.py"),
        ("line", line.as_str()),
    ];
    let by_client = parsed(&page);
    assert_eq!(parsed_value(&by_client, "tracer_growth_in_use_bytes", &labels), site["in_use_bytes"].as_f64());
    for (i, end) in ["lower", "upper"].into_iter().enumerate() {
        let mut with_bound = labels.to_vec();
        with_bound.push(("bound", end));
        let got = parsed_value(&by_client, "tracer_growth_in_use_bytes_ci95", &with_bound);
        assert_eq!(got, site["in_use_ci95"][i].as_f64(), "{end}: {site}");
    }
}
