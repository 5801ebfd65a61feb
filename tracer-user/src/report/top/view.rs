//! What `tracer top` shows, and how its keys change it: three tables (the
//! heap by type, growth by site, the probed functions' rates) built from
//! the latest interval of the model, each sortable by any of its columns.
//! Names come from the target: they are shown through
//! [`crate::text::display`], escaped, as the table report shows them.

use ratatui::{
    Frame,
    crossterm::event::{KeyCode, KeyEvent, KeyEventKind, KeyModifiers},
    layout::{Constraint, Layout, Rect},
    style::Stylize,
    text::Line,
    widgets::{Block, Paragraph, Row, Table, Wrap},
};

use crate::{
    heap::print::{bytes, thousands},
    model::{Attached, Snapshot},
    report::table::heap::{signed_bytes, signed_count},
    text::display,
};

/// The tables, in the order Tab visits them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pane {
    Heap,
    Growth,
    Rates,
}

impl Pane {
    const ALL: [Self; 3] = [Self::Heap, Self::Growth, Self::Rates];

    const fn index(self) -> usize {
        match self {
            Self::Heap => 0,
            Self::Growth => 1,
            Self::Rates => 2,
        }
    }

    const fn columns(self) -> &'static [Column] {
        match self {
            Self::Heap => HEAP,
            Self::Growth => GROWTH,
            Self::Rates => RATES,
        }
    }
}

/// A column: its heading, whether it holds numbers (sorted largest
/// first), and its width.
pub struct Column {
    pub title: &'static str,
    numeric: bool,
    width: Constraint,
}

const fn column(title: &'static str, numeric: bool, width: Constraint) -> Column {
    Column { title, numeric, width }
}

const HEAP: &[Column] = &[
    column("type", false, Constraint::Min(24)),
    column("objects", true, Constraint::Length(13)),
    column("objects Δ", true, Constraint::Length(12)),
    column("bytes", true, Constraint::Length(11)),
    column("bytes Δ", true, Constraint::Length(12)),
];
const GROWTH: &[Column] = &[
    column("function", false, Constraint::Min(20)),
    column("file:line", false, Constraint::Min(24)),
    column("in use", true, Constraint::Length(11)),
    column("growth", true, Constraint::Length(11)),
    column("samples", true, Constraint::Length(9)),
];
const RATES: &[Column] = &[
    column("function", false, Constraint::Min(20)),
    column("calls/s", true, Constraint::Length(22)),
    column("bytes/s", true, Constraint::Length(24)),
    column("calls traced", true, Constraint::Length(14)),
];

/// A cell: what is shown, and what it sorts by (`None`, unknown, sorts
/// last either way).
struct Cell {
    text: String,
    key: Key,
}

#[derive(Clone, Debug, PartialEq, PartialOrd)]
enum Key {
    Number(f64),
    Text(String),
    Unknown,
}

#[allow(clippy::cast_precision_loss, reason = "a sort key: 2^53 and more sort close enough")]
fn count(n: u64) -> Cell {
    Cell { text: thousands(n), key: Key::Number(n as f64) }
}

#[allow(clippy::cast_precision_loss, reason = "a sort key")]
fn size(n: u64) -> Cell {
    Cell { text: bytes(n), key: Key::Number(n as f64) }
}

#[allow(clippy::cast_precision_loss, reason = "a sort key")]
fn change(n: Option<i64>, show: fn(i64) -> String) -> Cell {
    n.map_or(Cell { text: "-".to_owned(), key: Key::Unknown }, |n| Cell { text: show(n), key: Key::Number(n as f64) })
}

fn text(s: String) -> Cell {
    Cell { key: Key::Text(s.to_lowercase()), text: s }
}

/// A rate, with `~` and its 95% interval where it is an estimate: "≥" its
/// low end beside it where the interval has no upper end (the windows
/// slowed the target past knowing by how much, `run::pace`), "≤" its
/// upper end for a zero (no call seen in the windows), and "?" for an
/// estimate not told from zero (no interval yet, or none with an upper end). "-" where there is no rate at all.
fn rate(per_s: Option<f64>, ci95: Option<[f64; 2]>, estimate: bool, unit: fn(f64) -> String) -> Cell {
    let Some(per_s) = per_s.filter(|r| r.is_finite()) else {
        let text = if estimate { "?" } else { "-" };
        return Cell { text: text.to_owned(), key: Key::Unknown };
    };
    let text = match (estimate, ci95) {
        (true, _) if !crate::model::rate_told(per_s, ci95) => "?".to_owned(),
        (true, Some([lo, hi])) if !hi.is_finite() => format!("~{} (≥{})", unit(per_s), unit(lo)),
        (true, Some([_, hi])) if per_s == 0.0 => format!("~0 (≤{})", unit(hi)),
        (true, Some([lo, hi])) => format!("~{} ±{:.0}%", unit(per_s), 100.0 * (hi - lo) / 2.0 / per_s),
        (true, None) => format!("~{}", unit(per_s)),
        (false, _) => unit(per_s),
    };
    Cell { text, key: Key::Number(per_s) }
}

/// Calls per second: whole above 10, with a decimal below (a rare call
/// is not shown as none).
#[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss, reason = "shown rounded; rates are not negative")]
fn per_second(n: f64) -> String {
    if n < 10.0 { format!("{n:.1}") } else { thousands(n.round() as u64) }
}

#[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss, reason = "shown rounded; rates are not negative")]
fn bytes_per_second(n: f64) -> String {
    format!("{}/s", bytes(n.round() as u64))
}

/// One table's sort: by which column, and which way.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Sort {
    column: usize,
    descending: bool,
}

/// What a key asks of the screen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// Draw again.
    Redraw,
    /// Detach and leave.
    Quit,
    /// Nothing changed.
    None,
}

/// The screen's state.
pub struct View {
    /// The first lines: the target and the mode.
    title: String,
    /// Whether the figures are estimates (the production profile).
    estimates: bool,
    /// Whether the run takes heap censuses (the profile with `--pid`).
    census: bool,
    /// The probes whose bytes mean something (`Attached::measures_bytes`).
    measures_bytes: Vec<String>,
    snapshot: Option<Snapshot>,
    /// The latest note tracer gave, shown at the bottom.
    note: Option<String>,
    focus: Pane,
    sorts: [Sort; 3],
    /// Set once q or Ctrl-C was pressed.
    pub quitting: bool,
}

impl View {
    #[must_use]
    pub fn new(attached: &Attached) -> Self {
        let target = match (attached.pid, &attached.exe) {
            (Some(pid), _) => format!("PID {pid}"),
            (None, Some(exe)) => display(exe),
            (None, None) if !attached.interpreters.is_empty() => {
                format!("every Python on the host ({})", display(&attached.python.image))
            }
            (None, None) => "the target".to_owned(),
        };
        let estimates = attached.mode.as_deref() == Some("profile");
        let mode = if estimates { "production profile: figures marked ~ are estimates" } else { "exact tracing" };
        Self {
            title: format!("tracer top · {target} · CPython {} · {mode}", display(&attached.python.version)),
            estimates,
            census: estimates && attached.pid.is_some(),
            measures_bytes: attached.measures_bytes.clone(),
            snapshot: None,
            note: None,
            focus: Pane::Heap,
            sorts: [
                Sort { column: 3, descending: true },
                Sort { column: 2, descending: true },
                Sort { column: 1, descending: true },
            ],
            quitting: false,
        }
    }

    /// The interval just reported.
    pub fn update(&mut self, snapshot: Snapshot) {
        self.snapshot = Some(snapshot);
    }

    /// A note tracer gave.
    pub fn note(&mut self, message: &str) {
        self.note = Some(display(message));
    }

    /// What `key` does: q or Ctrl-C quits, Tab moves between the tables,
    /// the arrows (or `<` and `>`) pick the column the focused one sorts
    /// by, a digit picks it by number, `r` reverses the order.
    pub fn key(&mut self, key: KeyEvent) -> Action {
        if key.kind == KeyEventKind::Release {
            return Action::None;
        }
        let sort = &mut self.sorts[self.focus.index()];
        let columns = self.focus.columns().len();
        let pick = |sort: &mut Sort, column: usize, pane: Pane| {
            *sort = Sort { column, descending: pane.columns()[column].numeric };
        };
        match key.code {
            KeyCode::Char('c') if key.modifiers.contains(KeyModifiers::CONTROL) => return Action::Quit,
            KeyCode::Char('q') | KeyCode::Esc => return Action::Quit,
            KeyCode::Tab => {
                self.focus = Pane::ALL[(self.focus.index() + 1) % Pane::ALL.len()];
            }
            KeyCode::BackTab => {
                self.focus = Pane::ALL[(self.focus.index() + Pane::ALL.len() - 1) % Pane::ALL.len()];
            }
            KeyCode::Right | KeyCode::Char('>') => pick(sort, (sort.column + 1) % columns, self.focus),
            KeyCode::Left | KeyCode::Char('<') => pick(sort, (sort.column + columns - 1) % columns, self.focus),
            KeyCode::Char(c @ '1'..='9') => {
                let column = c.to_digit(10).and_then(|d| usize::try_from(d).ok()).unwrap_or(0).saturating_sub(1);
                if column >= columns {
                    return Action::None;
                }
                pick(sort, column, self.focus);
            }
            KeyCode::Char('r') => sort.descending = !sort.descending,
            _ => return Action::None,
        }
        Action::Redraw
    }

    /// Draws the whole screen.
    pub fn draw(&self, frame: &mut Frame<'_>) {
        let [top, heap, growth, rates, foot] = Layout::vertical([
            Constraint::Length(2),
            Constraint::Fill(3),
            Constraint::Fill(2),
            Constraint::Fill(2),
            Constraint::Length(2),
        ])
        .areas(frame.area());
        frame
            .render_widget(Paragraph::new(vec![Line::from(self.title.clone().bold()), Line::from(self.status())]), top);
        let snapshot = self.snapshot.as_ref();
        let census = self.census;
        self.table(
            frame,
            heap,
            Pane::Heap,
            snapshot.map_or_else(|| waiting("the first interval"), |s| heap_rows(s, census)),
        );
        self.table(frame, growth, Pane::Growth, snapshot.map_or_else(|| waiting("the first interval"), growth_rows));
        let estimates = self.estimates;
        self.table(
            frame,
            rates,
            Pane::Rates,
            snapshot.map_or_else(|| waiting("the first interval"), |s| rates_rows(s, estimates, &self.measures_bytes)),
        );
        let keys = if self.quitting {
            "detaching…".to_owned()
        } else {
            "q quit · Tab next table · ←/→ or 1-5 sort column · r reverse".to_owned()
        };
        let mut lines = vec![Line::from(keys.dim())];
        if let Some(note) = &self.note {
            lines.push(Line::from(note.clone()));
        }
        frame.render_widget(Paragraph::new(lines), foot);
    }

    /// The second line: time, cost, collections.
    fn status(&self) -> String {
        let Some(s) = &self.snapshot else { return "attached; the first interval is coming".to_owned() };
        let mut parts = vec![format!("{:.1} s", s.elapsed_s)];
        if let Some(p) = &s.profile {
            // The run's so far: the budget holds over a run, and an
            // interval's own flickers with the census that falls in it.
            let (p, so_far) = p.so_far.as_deref().map_or((p, ""), |run| (run, " so far"));
            parts.push(format!(
                "cost ≈{:.2}% of the target's CPU time{so_far} (estimated; budget {}%)",
                p.fraction * 100.0,
                p.budget_percent
            ));
        } else if let Some(f) = s.cost.as_ref().and_then(|c| c.overhead_fraction) {
            parts.push(format!("estimated cost {:.1}% of the target's CPU time", f * 100.0));
        }
        if let Some(gc) = &s.gc {
            let generations: Vec<String> = gc
                .generations
                .iter()
                .map(|g| match g.generation {
                    Some(n) => format!("gen{n} {}", thousands(g.collections)),
                    None => format!("unknown {}", thousands(g.collections)),
                })
                .collect();
            if !generations.is_empty() {
                parts.push(format!("GC {}", generations.join(" ")));
            }
        }
        parts.join(" · ")
    }

    /// One table, its rows sorted as its pane's sort says, with the
    /// columns that fit its pane whole ([`super::fit`]).
    fn table(&self, frame: &mut Frame<'_>, area: Rect, pane: Pane, rows: Rows) {
        let sort = self.sorts[pane.index()];
        let columns = pane.columns();
        let titles: Vec<String> = columns
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let mark = match (i == sort.column, sort.descending) {
                    (false, _) => "",
                    (true, true) => " ▼",
                    (true, false) => " ▲",
                };
                format!("{}{mark}", c.title)
            })
            .collect();
        let width = |text: &str| u16::try_from(ratatui::text::Span::raw(text).width()).unwrap_or(u16::MAX);
        let wants: Vec<super::fit::Want> = columns
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let cells = rows.body.iter().filter_map(|r| r.get(i)).map(|cell| width(&cell.text));
                super::fit::Want { width: c.width, numeric: c.numeric, widest: cells.fold(width(&titles[i]), u16::max) }
            })
            .collect();
        let shown = super::fit::fitting(&wants, Block::bordered().inner(area).width, 2);
        let widths: Vec<Constraint> = shown.iter().map(|c| c.1).collect();
        let header = Row::new(shown.iter().map(|c| titles[c.0].clone())).bold();
        // Said right after the pane's name, which a narrow pane still
        // shows of its title.
        let title = match columns.len() - shown.len() {
            0 => rows.title.clone(),
            n => {
                let (name, rest) = rows.title.split_once(" · ").unwrap_or((rows.title.as_str(), ""));
                let rest = if rest.is_empty() { String::new() } else { format!(" · {rest}") };
                let s = if n == 1 { "" } else { "s" };
                format!("{name} [{n} column{s} hidden: widen the terminal]{rest}")
            }
        };
        let focused = pane == self.focus;
        let title = if focused { Line::from(format!(" {title} ").bold()) } else { Line::from(format!(" {title} ")) };
        let block = Block::bordered().title(title);
        let block = if focused { block } else { block.dim() };
        let mut body = rows.body;
        if body.is_empty()
            && let Some(why) = rows.last
        {
            // A table with no row, only why (no census with --exe, growth
            // unavailable): the reason spans the pane, wrapped, instead of
            // being cut to the first column's width.
            let inner = block.inner(area);
            frame.render_widget(block, area);
            let [head, text] = Layout::vertical([Constraint::Length(1), Constraint::Fill(1)]).areas(inner);
            frame.render_widget(Table::new(Vec::<Row<'_>>::new(), widths).header(header).column_spacing(2), head);
            frame.render_widget(Paragraph::new(why).wrap(Wrap { trim: true }).dim(), text);
            return;
        }
        body.sort_by(|a, b| order(&a[sort.column].key, &b[sort.column].key, sort.descending));
        let mut lines: Vec<Row<'_>> = body
            .into_iter()
            .map(|mut cells| Row::new(shown.iter().map(|c| std::mem::take(&mut cells[c.0].text))))
            .collect();
        lines.extend(rows.last.map(|l| Row::new(vec![l]).dim()));
        frame.render_widget(Table::new(lines, widths).header(header).block(block).column_spacing(2), area);
    }
}

/// How two rows' keys sort: numbers and text either way, unknown last
/// either way.
fn order(a: &Key, b: &Key, descending: bool) -> std::cmp::Ordering {
    use std::cmp::Ordering;
    let order = match (a, b) {
        (Key::Unknown, Key::Unknown) => Ordering::Equal,
        (Key::Unknown, _) => return Ordering::Greater,
        (_, Key::Unknown) => return Ordering::Less,
        (Key::Number(a), Key::Number(b)) => a.total_cmp(b),
        _ => a.partial_cmp(b).unwrap_or(Ordering::Equal),
    };
    if descending { order.reverse() } else { order }
}

/// A table's rows (unsorted), its title, and a line after them.
struct Rows {
    title: String,
    body: Vec<Vec<Cell>>,
    last: Option<String>,
}

fn waiting(what: &str) -> Rows {
    Rows { title: format!("waiting for {what}"), body: Vec::new(), last: None }
}

fn heap_rows(s: &Snapshot, census: bool) -> Rows {
    let Some(heap) = &s.heap else {
        let why = if census {
            "no census yet: the production profile takes one as its budget allows"
        } else {
            "no census in this run: the heap is read in the production profile with --pid (not with --exact or --exe)"
        };
        return Rows { title: "heap by type".to_owned(), body: Vec::new(), last: Some(why.to_owned()) };
    };
    let partial = if heap.partial.is_empty() { String::new() } else { ", PARTIAL".to_owned() };
    let since = heap.since_s.map_or_else(String::new, |s| format!(", changes since {s:.1} s"));
    let body = heap
        .types
        .iter()
        .map(|t| {
            vec![
                text(display(&t.name)),
                count(t.count),
                change(t.count_change, signed_count),
                size(t.bytes),
                change(t.bytes_change, signed_bytes),
            ]
        })
        .collect();
    let last = heap
        .other
        .filter(|o| o.types > 0)
        .map(|o| format!("and {} other types: {} objects, {}", thousands(o.types), thousands(o.count), bytes(o.bytes)));
    Rows {
        title: format!(
            "heap by type · census {} at {:.1} s{since}, read while running{partial}",
            heap.census, heap.taken_s
        ),
        body,
        last,
    }
}

fn growth_rows(s: &Snapshot) -> Rows {
    let title = "growth by site".to_owned();
    let Some(growth) = &s.growth else {
        return Rows { title, body: Vec::new(), last: Some("growth is not sampled in this run".to_owned()) };
    };
    let g = match growth {
        crate::model::Growth::Sampled(g) => g,
        crate::model::Growth::Unavailable { unavailable } => {
            return Rows { title, body: Vec::new(), last: Some(format!("unavailable: {}", display(unavailable))) };
        }
    };
    let body = g
        .sites
        .iter()
        .map(|site| {
            let at = site.line.map_or_else(|| display(&site.file), |l| format!("{}:{l}", display(&site.file)));
            vec![
                text(display(&site.function)),
                text(at),
                size(site.in_use_bytes),
                change(Some(site.bytes), signed_bytes),
                count(site.samples),
            ]
        })
        .collect();
    let stopped = g.stopped.as_ref().map(|s| format!("stopped at {:.1} s: {}", s.at_s, display(&s.reason)));
    Rows {
        title: format!(
            "growth by site · ~estimates, one pool in {} sampled · {}{} in use, {} over the interval",
            thousands(u64::from(g.sample_every)),
            bytes(g.in_use_bytes),
            crate::report::table::growth::in_use_error(g),
            signed_bytes(g.bytes)
        ),
        body,
        last: stopped,
    }
}

/// `measures_bytes`: the probes whose bytes mean something (the
/// allocating functions); the others show "-" for bytes.
fn rates_rows(s: &Snapshot, estimates: bool, measures_bytes: &[String]) -> Rows {
    let body = s
        .probes
        .iter()
        .map(|(name, p)| {
            let (calls, calls_ci, bytes_s, bytes_ci) = match p.estimate {
                Some(e) => (Some(e.calls_per_s), e.calls_per_s_ci95, Some(e.bytes_per_s), e.bytes_per_s_ci95),
                // In the profile, a rate the windows could not tell from
                // zero: no figure (shown "?").
                None if estimates => (None, None, None, None),
                None => (p.calls_per_s, None, p.bytes_per_s, None),
            };
            let marked = estimates || p.estimate.is_some();
            let bytes = if measures_bytes.contains(name) {
                rate(bytes_s, bytes_ci, marked, bytes_per_second)
            } else {
                Cell { text: "-".to_owned(), key: Key::Unknown }
            };
            vec![text(display(name)), rate(calls, calls_ci, marked, per_second), bytes, count(p.calls)]
        })
        .collect();
    let title = if estimates {
        "rates · ~estimates from the traced windows, with their 95% interval where known (? where no call was seen yet)"
            .to_owned()
    } else {
        "rates · exact, over the last interval".to_owned()
    };
    Rows { title, body, last: None }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_sorts_last_both_ways() {
        let keys = [Key::Number(1.0), Key::Unknown, Key::Number(3.0), Key::Number(-2.0)];
        for (descending, want) in [(true, ["3", "1", "-2", "?"]), (false, ["-2", "1", "3", "?"])] {
            let mut sorted = keys.to_vec();
            sorted.sort_by(|a, b| order(a, b, descending));
            let shown: Vec<String> =
                sorted.iter().map(|k| if let Key::Number(n) = k { n.to_string() } else { "?".to_owned() }).collect();
            assert_eq!(shown, want, "descending {descending}");
        }
    }

    /// The rates pane says what the table says: the point estimate beside
    /// a lower bound, a zero's upper bound, and no figure for a rate not
    /// told from zero.
    #[test]
    fn estimated_rates_show_their_bounds() {
        let shown = |per_s, ci, estimate| rate(per_s, ci, estimate, per_second).text;
        assert_eq!(shown(Some(27_807.0), Some([0.0, f64::INFINITY]), true), "~27,807 (≥0.0)");
        assert_eq!(shown(Some(0.0), Some([0.0, 1151.0]), true), "~0 (≤1,151)");
        assert_eq!(shown(Some(0.0), Some([0.0, f64::INFINITY]), true), "?");
        assert_eq!(shown(Some(2000.0), Some([1900.0, 2100.0]), true), "~2,000 ±5%");
        assert_eq!(shown(Some(0.0), None, true), "?");
        assert_eq!(shown(None, None, true), "?");
        assert_eq!(shown(Some(1234.0), None, true), "~1,234");
        assert_eq!(shown(Some(0.0), None, false), "0.0");
        assert_eq!(shown(None, None, false), "-");
    }

    /// With --exe there is no census and growth is unavailable: each pane
    /// says why in full, wrapped, not cut at its first column.
    #[test]
    fn a_pane_with_no_row_says_why_in_full() {
        let attached: Attached = serde_json::from_value(serde_json::json!({
            "mode": "profile", "pid": null, "exe": "/usr/bin/python3.11",
            "python": {"version": "3.11.2", "image": "/usr/bin/python3.11"},
            "probes": [], "missing": [], "links": "multi", "returns": {}, "return_costs_ns": null,
            "call_sites": {}, "placements": {}
        }))
        .expect("an attached event");
        let mut view = View::new(&attached);
        view.update(Snapshot::default());
        let mut terminal = ratatui::Terminal::new(ratatui::backend::TestBackend::new(100, 40)).expect("a terminal");
        terminal.draw(|frame| view.draw(frame)).expect("drawn");
        let screen: String = terminal
            .backend()
            .buffer()
            .content()
            .chunks(100)
            .map(|row| {
                row.iter().map(ratatui::buffer::Cell::symbol).collect::<String>().trim_matches('│').trim().to_owned()
                    + " "
            })
            .collect();
        let words = |s: &str| s.split_whitespace().collect::<Vec<_>>().join(" ");
        let screen = words(&screen);
        let why =
            "no census in this run: the heap is read in the production profile with --pid (not with --exact or --exe)";
        assert!(screen.contains(why), "{screen}");
    }

    #[test]
    fn text_sorts_alphabetically() {
        let (a, b) = (Key::Text("alpha".to_owned()), Key::Text("beta".to_owned()));
        assert_eq!(order(&a, &b, false), std::cmp::Ordering::Less);
        assert_eq!(order(&a, &b, true), std::cmp::Ordering::Greater);
    }
}
