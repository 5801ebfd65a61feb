//! The flame graph as a reader sees it: tracer traces tests/python/sites.py
//! (N bytearrays in `make_a`, 3N in `make_b`) with `--flamegraph` and
//! `--folded`; headless Chromium (Debian's package, which `cargo xtask
//! setup` installs) screenshots the SVG at the SVG's own size. The PNG must
//! decode to an image of that size with a flame graph's many colours, and
//! show the frames of `make_a` and `make_b` where the SVG puts them, in
//! their colours and with their (dark) labels in them; the SVG's text names
//! both, and inferno accepts the folded file.

use std::{
    collections::HashSet,
    io::Read as _,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use serde_json::Value;
use tracer_tests::{TracerRun, Workload, require_root, shared_python};

/// Debian's Chromium, from `cargo xtask setup`.
const CHROMIUM: &str = "/usr/bin/chromium";

/// How long Chromium may take to start, render and write the screenshot.
const SCREENSHOT_TIMEOUT: Duration = Duration::from_mins(2);

/// A directory of this test's, removed when dropped.
struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The line of tests/python/sites.py that ends with `marker`.
fn line_of(marker: &str) -> usize {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("python/sites.py");
    let text = std::fs::read_to_string(&script).expect("sites.py");
    text.lines().position(|l| l.ends_with(marker)).unwrap_or_else(|| panic!("no {marker} in sites.py")) + 1
}

/// The calls at `make_a`'s and `make_b`'s allocating lines in an
/// interval's sites, once both are there.
fn site_calls(line: &Value) -> Option<(u64, u64)> {
    let at = |function: &str| {
        let l = line_of(&format!("# {function} allocates"));
        line["sites"].as_array()?.iter().find(|s| s["function"] == function && s["line"] == l)?["calls"].as_u64()
    };
    Some((at("make_a")?, at("make_b")?))
}

/// Runs sites.py under `tracer attach --stacks EXTRA` until two intervals
/// in a row show the same calls at both sites (so that every stack was
/// named while the process ran), then stops tracer; returns its summary.
fn trace_sites(extra: &[&str]) -> Value {
    let python = shared_python();
    let mut workload = Workload::script(None, &python.display().to_string(), "sites.py", &["300", "flat"]);
    let mut args = vec!["--stacks", "--interval", "0.1"];
    args.extend_from_slice(extra);
    let (tracer, _) = TracerRun::attach_json(workload.pid(), &args);
    workload.go();
    workload.expect("done");
    let mut last = None;
    for _ in 0..600 {
        let line = tracer.stdout.next_line("an interval").expect("tracer printed an interval");
        let line: Value = serde_json::from_str(&line).expect("JSON");
        if line["type"] != "interval" {
            continue;
        }
        let now = site_calls(&line);
        if now.is_some() && now == last {
            break;
        }
        last = now;
    }
    workload.close();
    let (status, lines, stderr) = tracer.finish();
    assert!(status.success(), "tracer failed: {status}: {stderr}");
    let summary = lines.last().expect("a summary").clone();
    assert_eq!(summary["type"], "summary", "{lines:?}");
    summary
}

/// The value of attribute `name` in the tag that starts `tag`.
fn attr<'a>(tag: &'a str, name: &str) -> Option<&'a str> {
    let end = tag.find('>').unwrap_or(tag.len());
    let tag = &tag[..end];
    let key = format!(" {name}=\"");
    let start = tag.find(&key)? + key.len();
    Some(&tag[start..start + tag[start..].find('"')?])
}

fn number(tag: &str, name: &str) -> f64 {
    let v = attr(tag, name).unwrap_or_else(|| panic!("no {name} in {tag}"));
    v.trim_end_matches('%').parse().unwrap_or_else(|e| panic!("{name}={v:?} in {tag}: {e}"))
}

/// A frame's box in the picture, in pixels, and its fill.
#[derive(Debug)]
struct FrameBox {
    x: f64,
    y: f64,
    width: f64,
    height: f64,
    fill: [u8; 3],
}

/// The SVG's size, and the box of the widest frame whose title starts
/// with `name`. inferno draws the frames in a nested `<svg id="frames">`,
/// with x and width in percent of it and y and height in pixels.
fn frame_box(svg: &str, name: &str) -> FrameBox {
    let frames = &svg[svg.find("<svg id=\"frames\"").expect("inferno's frames element")..];
    let (left, span) = (number(frames, "x"), number(frames, "width"));
    let title = format!("<title>{name}");
    let mut widest: Option<FrameBox> = None;
    let mut after = frames;
    while let Some(at) = after.find(&title) {
        after = &after[at + title.len()..];
        let rect = &after[after.find("<rect").expect("a frame's rect")..];
        let fill = attr(rect, "fill").expect("a frame's fill");
        let rgb: Vec<u8> = fill
            .trim_start_matches("rgb(")
            .trim_end_matches(')')
            .split(',')
            .map(|c| c.trim().parse().unwrap_or_else(|e| panic!("fill {fill}: {e}")))
            .collect();
        let b = FrameBox {
            x: left + number(rect, "x") / 100.0 * span,
            y: number(rect, "y"),
            width: number(rect, "width") / 100.0 * span,
            height: number(rect, "height"),
            fill: rgb.try_into().unwrap_or_else(|_| panic!("fill {fill}")),
        };
        if widest.as_ref().is_none_or(|w| b.width > w.width) {
            widest = Some(b);
        }
    }
    widest.unwrap_or_else(|| panic!("no frame titled {name}… in the SVG"))
}

/// A decoded screenshot, 8-bit RGB.
struct Picture {
    width: usize,
    height: usize,
    rgb: Vec<u8>,
}

impl Picture {
    fn read(path: &Path) -> Self {
        let file = std::fs::File::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let mut decoder = png::Decoder::new(std::io::BufReader::new(file));
        decoder.set_transformations(png::Transformations::normalize_to_color8());
        let mut reader = decoder.read_info().unwrap_or_else(|e| panic!("{} is no PNG: {e}", path.display()));
        let mut buf = vec![0; reader.output_buffer_size().expect("a PNG of a sane size")];
        let info = reader.next_frame(&mut buf).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let channels = match info.color_type {
            png::ColorType::Rgb => 3,
            png::ColorType::Rgba => 4,
            other => panic!("a screenshot in {other:?}"),
        };
        let rgb = buf[..info.buffer_size()].chunks_exact(channels).flat_map(|p| [p[0], p[1], p[2]]).collect();
        Self { width: info.width as usize, height: info.height as usize, rgb }
    }

    fn pixel(&self, x: usize, y: usize) -> [u8; 3] {
        let i = (y * self.width + x) * 3;
        [self.rgb[i], self.rgb[i + 1], self.rgb[i + 2]]
    }

    /// The pixels inside `b`, a little in from its edges (which the
    /// renderer blends with the background).
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss, reason = "pixel coordinates within the picture")]
    fn inside(&self, b: &FrameBox) -> Vec<[u8; 3]> {
        let (x0, x1) = ((b.x + 2.0).ceil() as usize, ((b.x + b.width - 2.0).floor() as usize).min(self.width));
        let (y0, y1) = ((b.y + 2.0).ceil() as usize, ((b.y + b.height - 2.0).floor() as usize).min(self.height));
        (y0..y1).flat_map(|y| (x0..x1).map(move |x| (x, y))).map(|(x, y)| self.pixel(x, y)).collect()
    }
}

/// Screenshots `svg` with headless Chromium at `width` × `height`.
fn screenshot(svg: &Path, png: &Path, (width, height): (u32, u32), profile: &Path) {
    assert!(Path::new(CHROMIUM).is_file(), "{CHROMIUM} is missing: run `cargo xtask setup` (Debian's chromium)");
    let mut child = Command::new(CHROMIUM)
        .args([
            "--headless",
            // Chromium's sandbox refuses to run as root; the page is our own.
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            "--force-device-scale-factor=1",
            "--no-first-run",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .arg(format!("--screenshot={}", png.display()))
        .arg(format!("--window-size={width},{height}"))
        .arg(format!("file://{}", svg.display()))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {CHROMIUM}: {e}"));
    let mut stderr = child.stderr.take().expect("piped stderr");
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s);
        s
    });
    let deadline = Instant::now() + SCREENSHOT_TIMEOUT;
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for chromium") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("chromium took over {SCREENSHOT_TIMEOUT:?}: {}", reader.join().unwrap_or_default());
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let stderr = reader.join().unwrap_or_default();
    assert!(status.success() && png.is_file(), "chromium failed ({status}), no {}: {stderr}", png.display());
}

#[test]
fn the_flame_graph_shows_both_sites_in_chromium() {
    require_root();
    let dir = TempDir(std::env::temp_dir().join(format!("tracer-flame-graph-{}", std::process::id())));
    std::fs::create_dir_all(&dir.0).expect("a directory");
    let (folded, svg, png) = (dir.0.join("sites.folded"), dir.0.join("sites.svg"), dir.0.join("sites.png"));
    let (f, s) = (folded.display().to_string(), svg.display().to_string());
    let summary = trace_sites(&["--folded", &f, "--flamegraph", &s]);
    let (a, b) = site_calls(&summary).unwrap_or_else(|| panic!("no make_a and make_b sites: {summary}"));
    assert!(b > a && a > 0, "make_a {a} calls, make_b {b}");

    let text = std::fs::read_to_string(&svg).expect("the SVG");
    for name in ["make_a", "make_b", "by calls"] {
        assert!(text.contains(name), "the SVG has no {name}: {text}");
    }
    let root = &text[text.find("<svg").expect("an <svg> element")..];
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss, reason = "an SVG's size in pixels")]
    let size = (number(root, "width") as u32, number(root, "height") as u32);
    screenshot(&svg, &png, size, &dir.0.join("chromium-profile"));

    let picture = Picture::read(&png);
    assert_eq!((picture.width, picture.height), (size.0 as usize, size.1 as usize), "the screenshot's size");
    let colours: HashSet<[u8; 3]> = picture.rgb.chunks_exact(3).map(|p| [p[0], p[1], p[2]]).collect();
    // A blank or one-colour page has a handful; the background gradient,
    // the frames and the anti-aliased text give hundreds.
    assert!(colours.len() >= 64, "{} colours in the screenshot", colours.len());
    for name in ["make_a", "make_b"] {
        let line = line_of(&format!("# {name} allocates"));
        let b = frame_box(&text, &format!("{name} (sites.py:{line})"));
        let pixels = picture.inside(&b);
        assert!(pixels.len() >= 100, "{name}'s frame {b:?} is {} pixels", pixels.len());
        let close = |p: &[u8; 3]| p.iter().zip(b.fill).all(|(c, f)| c.abs_diff(f) <= 6);
        let filled = pixels.iter().filter(|p| close(p)).count();
        // Its label is drawn in black over the fill.
        let dark = pixels.iter().filter(|p| p.iter().map(|&c| u32::from(c)).sum::<u32>() < 240).count();
        assert!(filled * 2 >= pixels.len(), "{name}'s frame {b:?}: {filled} of {} pixels in its fill", pixels.len());
        assert!(dark >= 20, "{name}'s frame {b:?}: {dark} dark (text) pixels");
    }

    // inferno reads the folded file back into a flame graph of both.
    let folded_text = std::fs::read_to_string(&folded).expect("the folded file");
    let mut again = Vec::new();
    inferno::flamegraph::from_lines(&mut inferno::flamegraph::Options::default(), folded_text.lines(), &mut again)
        .unwrap_or_else(|e| panic!("inferno refuses the folded file: {e}\n{folded_text}"));
    let again = String::from_utf8(again).expect("an SVG");
    assert!(again.contains("make_a") && again.contains("make_b"), "{again}");
}
