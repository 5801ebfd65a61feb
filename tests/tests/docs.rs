//! The README and docs/ stay honest: the README stays short and keeps the
//! Quick start that CI runs, every docs/ page is reachable from it, every
//! link leads to a file and heading that exist, every flag written in a
//! `tracer <subcommand> …` example is one that subcommand of the binary
//! under test accepts, every flag a subcommand's `--help` lists is
//! documented on its docs/ page, and every row of an options table names
//! a flag the binary takes.
//!
//! No root needed: the binary is only asked for its `--help`.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
};

use tracer_tests::run_tracer;

/// The README's hard limit, in bytes (issue 22: about 15 KB, under 20 KB).
const README_LIMIT: usize = 20_000;

/// The Quick start's two commands, as they must stay (`.ci/run` runs the
/// second).
const QUICK_START: [&str; 2] = ["cargo xtask demo", "cargo xtask test"];

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("tests/ is in the workspace").to_path_buf()
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
}

/// docs/*.md, relative to the workspace, sorted.
fn docs_pages() -> Vec<String> {
    let dir = root().join("docs");
    let mut pages: Vec<String> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("cannot list {}: {e}", dir.display()))
        .map(|entry| entry.expect("a docs/ entry").file_name().into_string().expect("a UTF-8 file name"))
        .filter(|name| Path::new(name).extension().is_some_and(|ext| ext == "md"))
        .map(|name| format!("docs/{name}"))
        .collect();
    pages.sort();
    assert!(!pages.is_empty(), "docs/ has no .md page");
    pages
}

/// The README and every docs/ page, relative to the workspace.
fn checked_pages() -> Vec<String> {
    let mut pages = vec!["README.md".to_owned()];
    pages.extend(docs_pages());
    pages
}

/// A page split into its prose (fenced code blocks blanked, so that line
/// numbers still count) and its fenced code lines with their line numbers.
struct Page {
    prose: String,
    code: Vec<(usize, String)>,
}

impl Page {
    fn parse(text: &str) -> Self {
        let mut prose = String::new();
        let mut code = Vec::new();
        let mut fenced = false;
        for (i, line) in text.lines().enumerate() {
            if line.trim_start().starts_with("```") {
                fenced = !fenced;
                prose.push('\n');
                continue;
            }
            if fenced {
                code.push((i + 1, line.to_owned()));
                prose.push('\n');
            } else {
                prose.push_str(line);
                prose.push('\n');
            }
        }
        assert!(!fenced, "a fenced code block is never closed");
        Self { prose, code }
    }

    /// The inline code spans of the prose (single backticks, which may run
    /// over a line break, as Markdown allows), with the line each starts on.
    fn code_spans(&self) -> Vec<(usize, String)> {
        let mut spans = Vec::new();
        let mut line = 1;
        let mut current: Option<(usize, String)> = None;
        let mut after_newline = false;
        for c in self.prose.chars() {
            match (c, current.as_mut()) {
                // A blank line ends the paragraph, and with it a span that
                // a lone backtick left open.
                ('\n', Some(_)) if after_newline => current = None,
                ('`', None) => current = Some((line, String::new())),
                ('`', Some(_)) => spans.extend(current.take()),
                ('\n', Some((_, span))) => span.push(' '),
                (c, Some((_, span))) => span.push(c),
                _ => {}
            }
            after_newline = c == '\n';
            if after_newline {
                line += 1;
            }
        }
        spans
    }

    /// The prose with its inline code spans removed (kept as blanks).
    fn prose_outside_code(&self) -> String {
        let mut out = String::with_capacity(self.prose.len());
        let mut in_span = false;
        for c in self.prose.chars() {
            if c == '`' {
                in_span = !in_span;
                out.push(' ');
            } else if in_span && c != '\n' {
                out.push(' ');
            } else {
                out.push(c);
            }
        }
        out
    }
}

/// GitHub's anchor for a heading: lower case, spaces to hyphens, every
/// other character but letters, digits, `-` and `_` dropped.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// The anchors of a Markdown file's headings (outside fenced code), with
/// GitHub's `-1`, `-2` … for repeated ones.
fn anchors(text: &str) -> BTreeSet<String> {
    let page = Page::parse(text);
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut out = BTreeSet::new();
    for line in page.prose.lines() {
        let hashes = line.chars().take_while(|&c| c == '#').count();
        if hashes == 0 || hashes > 6 || !line[hashes..].starts_with(' ') {
            continue;
        }
        let base = slug(&line[hashes..]);
        let n = seen.entry(base.clone()).or_insert(0);
        out.insert(if *n == 0 { base.clone() } else { format!("{base}-{n}") });
        *n += 1;
    }
    out
}

/// The targets of the inline links `[text](target)` in a page's prose,
/// with the line each is on.
fn links(text: &str) -> Vec<(usize, String)> {
    let prose = Page::parse(text).prose_outside_code();
    let mut out = Vec::new();
    for (i, line) in prose.lines().enumerate() {
        let mut rest = line;
        while let Some(at) = rest.find("](") {
            let after = &rest[at + 2..];
            let Some(end) = after.find(')') else { break };
            out.push((i + 1, after[..end].to_owned()));
            rest = &after[end..];
        }
    }
    out
}

#[test]
fn readme_is_short_and_keeps_the_quick_start() {
    let readme = read(&root().join("README.md"));
    assert!(
        readme.len() < README_LIMIT,
        "README.md is {} bytes, {README_LIMIT} or more: move the detail into a docs/ page and link it",
        readme.len()
    );
    let start = readme.find("\n## Quick start\n").expect("README.md has a `## Quick start` section");
    let section = &readme[start + 1..];
    let section = section[3..].find("\n## ").map_or(section, |end| &section[..end + 3]);
    let page = Page::parse(section);
    for command in QUICK_START {
        assert!(
            page.code.iter().any(|(_, line)| line
                .trim_start()
                .strip_prefix(command)
                .is_some_and(|rest| rest.is_empty() || rest.starts_with(char::is_whitespace))),
            "the README's Quick start has no code line that runs `{command}`:\n{section}"
        );
    }
    let ci = read(&root().join(".ci/run"));
    assert!(
        ci.lines().any(|line| line.trim_start().starts_with("exec cargo xtask test")),
        ".ci/run no longer runs `cargo xtask test`, the README's test command:\n{ci}"
    );
}

#[test]
fn every_docs_page_is_linked_from_the_readme() {
    let readme = read(&root().join("README.md"));
    let linked: BTreeSet<String> =
        links(&readme).into_iter().map(|(_, target)| target.split('#').next().unwrap_or_default().to_owned()).collect();
    let missing: Vec<String> = docs_pages().into_iter().filter(|page| !linked.contains(page)).collect();
    assert!(missing.is_empty(), "docs/ pages the README does not link to: {missing:?}");
}

#[test]
fn every_link_leads_to_a_file_and_heading_that_exist() {
    let root = root();
    let mut pages = checked_pages();
    pages.push("BENCHMARKS.md".to_owned());
    let mut broken = Vec::new();
    let mut checked = 0;
    for page in &pages {
        let text = read(&root.join(page));
        let dir = Path::new(page).parent().unwrap_or_else(|| Path::new(""));
        for (line, target) in links(&text) {
            if target.starts_with("http://") || target.starts_with("https://") || target.starts_with("mailto:") {
                continue;
            }
            checked += 1;
            let (file, anchor) = target.split_once('#').unwrap_or((&target, ""));
            let path = if file.is_empty() { root.join(page) } else { root.join(dir).join(file) };
            if !path.exists() {
                broken.push(format!("{page}:{line}: ({target}): {} does not exist", path.display()));
                continue;
            }
            if anchor.is_empty() {
                continue;
            }
            if path.extension().is_none_or(|ext| ext != "md") {
                broken.push(format!("{page}:{line}: ({target}): an anchor into a file that is not Markdown"));
            } else if !anchors(&read(&path)).contains(anchor) {
                broken.push(format!(
                    "{page}:{line}: ({target}): no heading of {} has the anchor #{anchor}",
                    path.display()
                ));
            }
        }
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
    assert!(checked > pages.len(), "only {checked} links found in {} pages: is the link parser broken?", pages.len());
}

/// The subcommands `tracer --help` lists, but `help`.
fn subcommands() -> Vec<String> {
    let (code, out, err) = run_tracer(&["--help"]);
    assert_eq!(code, Some(0), "tracer --help failed: {err}");
    let commands = out.split_once("Commands:\n").expect("tracer --help lists its commands").1;
    let names: Vec<String> = commands
        .lines()
        .take_while(|line| line.starts_with("  "))
        .filter_map(|line| line.split_whitespace().next())
        .filter(|name| *name != "help")
        .map(str::to_owned)
        .collect();
    assert!(names.len() >= 4, "tracer --help lists only {names:?}");
    names
}

/// The long flags `tracer SUBCOMMAND --help` documents.
fn flags_of(subcommand: &str) -> BTreeSet<String> {
    let (code, out, err) = run_tracer(&[subcommand, "--help"]);
    assert_eq!(code, Some(0), "tracer {subcommand} --help failed: {err}");
    let flags: BTreeSet<String> = out
        .lines()
        .map(str::trim_start)
        .filter(|line| line.starts_with('-'))
        .flat_map(|line| {
            line.split(|c: char| c.is_whitespace() || c == ',')
                .filter(|word| !word.is_empty())
                .take_while(|word| word.starts_with('-'))
                .filter(|word| word.starts_with("--"))
                .map(|word| word.split('=').next().unwrap_or(word).to_owned())
                .collect::<Vec<_>>()
        })
        .collect();
    assert!(flags.contains("--help"), "tracer {subcommand} --help lists no --help: {out}");
    flags
}

/// The commands of a shell line, each as its words, as far as an example
/// goes: quoted strings and `$(…)` are one word each; `;`, `|` and `&`
/// start another command; a redirection ends one, and a comment the line.
fn commands(line: &str) -> Vec<Vec<String>> {
    let mut out = vec![Vec::new()];
    let mut word = String::new();
    let mut redirected = false;
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\'' | '"' => {
                word.push(c);
                for q in chars.by_ref() {
                    word.push(q);
                    if q == c {
                        break;
                    }
                }
            }
            '$' if chars.peek() == Some(&'(') => {
                let mut depth = 0;
                word.push(c);
                for p in chars.by_ref() {
                    word.push(p);
                    match p {
                        '(' => depth += 1,
                        ')' if depth == 1 => break,
                        ')' => depth -= 1,
                        _ => {}
                    }
                }
            }
            '#' if word.is_empty() => break,
            ';' | '|' | '&' | '>' | '<' | ' ' | '\t' => {
                if !word.is_empty() && !redirected {
                    out.last_mut().expect("one command at least").push(std::mem::take(&mut word));
                }
                word.clear();
                match c {
                    '>' | '<' => redirected = true,
                    ';' | '|' | '&' => {
                        redirected = false;
                        out.push(Vec::new());
                    }
                    _ => {}
                }
            }
            c => word.push(c),
        }
    }
    if !word.is_empty() && !redirected {
        out.last_mut().expect("one command at least").push(word);
    }
    out.retain(|command| !command.is_empty());
    out
}

/// Each `tracer SUBCOMMAND …` in `text`: the subcommand and its words.
fn invocations<'a>(text: &str, subcommands: &'a [String]) -> Vec<(&'a str, Vec<String>)> {
    let mut out = Vec::new();
    for words in commands(text) {
        let is_tracer = |w: &String| w == "tracer" || w.ends_with("/tracer");
        let Some(at) = words.iter().position(is_tracer) else { continue };
        let Some(sub) = words.get(at + 1).and_then(|next| subcommands.iter().find(|s| *s == next)) else { continue };
        out.push((sub.as_str(), words[at + 2..].to_vec()));
    }
    out
}

#[test]
fn every_flag_in_an_example_is_one_its_subcommand_accepts() {
    let root = root();
    let subcommands = subcommands();
    let flags: BTreeMap<&str, BTreeSet<String>> = subcommands.iter().map(|s| (s.as_str(), flags_of(s))).collect();
    let mut unknown = Vec::new();
    let mut readme_examples: BTreeSet<&str> = BTreeSet::new();
    for page_name in checked_pages() {
        let page = Page::parse(&read(&root.join(&page_name)));
        for (line, text) in page.code.iter().chain(page.code_spans().iter()) {
            for (sub, args) in invocations(text, &subcommands) {
                if page_name == "README.md" && page.code.iter().any(|(l, _)| l == line) {
                    readme_examples.insert(sub);
                }
                // A bare `--` ends tracer's options (`tracer run -- COMMAND`).
                for arg in args.iter().take_while(|a| *a != "--").filter(|a| a.starts_with("--")) {
                    let flag = arg.split('=').next().unwrap_or(arg);
                    if !flags[sub].contains(flag) {
                        unknown.push(format!("{page_name}:{line}: `tracer {sub}` has no {flag}: {}", text.trim()));
                    }
                }
            }
        }
    }
    assert!(unknown.is_empty(), "flags the binary does not accept:\n{}", unknown.join("\n"));
    // The README shows every subcommand at work in a code block, so each
    // subcommand's flags were checked there at least once.
    for sub in &subcommands {
        assert!(readme_examples.contains(sub.as_str()), "the README has no `tracer {sub} …` example in a code block");
    }
}

/// Whether `text` names `flag` as itself: `--growth` in "`--growth`" or
/// "--growth FILE", not in "--growth-folded".
fn mentions(text: &str, flag: &str) -> bool {
    text.match_indices(flag).any(|(at, _)| {
        let before = text[..at].chars().next_back();
        let after = text[at + flag.len()..].chars().next();
        before.is_none_or(|c| !c.is_alphanumeric() && c != '-')
            && after.is_none_or(|c| !c.is_alphanumeric() && c != '-' && c != '_')
    })
}

/// The first cells of the rows of a page's options tables (those whose
/// header's first cell is `option`), with the line each is on.
fn option_rows(text: &str) -> Vec<(usize, String)> {
    let page = Page::parse(text);
    let mut rows = Vec::new();
    let mut in_table = false;
    for (i, line) in page.prose.lines().enumerate() {
        let Some(row) = line.strip_prefix('|') else {
            in_table = false;
            continue;
        };
        let first = row.split('|').next().unwrap_or_default().trim();
        if first == "option" {
            in_table = true;
        } else if in_table && !first.starts_with("---") {
            rows.push((i + 1, first.to_owned()));
        }
    }
    rows
}

/// The long flags written in an options table's first cell
/// (`` `-p, --pid PID` ``, `` `--fast` / `--rigorous` ``).
fn flags_in(cell: &str) -> Vec<String> {
    cell.split(|c: char| c.is_whitespace() || c == '`' || c == ',' || c == '/')
        .filter(|word| word.starts_with("--") && word.len() > 2)
        .map(|word| word.split('=').next().unwrap_or(word).to_owned())
        .collect()
}

/// The subcommands that take `attach`'s options, which
/// docs/attach.md's table documents for them.
const TAKE_ATTACH_OPTIONS: [&str; 3] = ["run", "top", "probes"];

#[test]
fn every_flag_a_subcommand_takes_is_documented_on_its_page() {
    // A flag in `tracer SUB --help` is documented in docs/SUB.md: in a row
    // of its options table where the page has one (attach, bench, stack),
    // else anywhere on the page; run, top and probes may also lean on
    // attach.md's table, whose options they take.
    let root = root();
    let attach_rows: Vec<String> =
        option_rows(&read(&root.join("docs/attach.md"))).into_iter().map(|(_, cell)| cell).collect();
    assert!(attach_rows.len() > 20, "docs/attach.md's options table has only {} rows", attach_rows.len());
    let mut undocumented = Vec::new();
    for sub in subcommands() {
        let page = format!("docs/{sub}.md");
        let text = read(&root.join(&page));
        let rows: Vec<String> = option_rows(&text).into_iter().map(|(_, cell)| cell).collect();
        for flag in flags_of(&sub) {
            if flag == "--help" {
                continue;
            }
            let in_row = |rows: &[String]| rows.iter().any(|cell| flags_in(cell).contains(&flag));
            let documented = if rows.is_empty() { mentions(&text, &flag) } else { in_row(&rows) }
                || (TAKE_ATTACH_OPTIONS.contains(&sub.as_str()) && in_row(&attach_rows));
            if !documented {
                let place = if rows.is_empty() { "anywhere on" } else { "in the options table of" };
                undocumented.push(format!("tracer {sub} {flag}: not {place} {page}"));
            }
        }
    }
    assert!(undocumented.is_empty(), "flags --help lists that docs/ does not document:\n{}", undocumented.join("\n"));
}

#[test]
fn every_option_a_table_documents_is_one_the_binary_takes() {
    // The other way round: an options table's row names only flags its
    // subcommand accepts (a flag renamed or removed leaves no row behind).
    let root = root();
    let mut stale = Vec::new();
    let mut checked = 0;
    for sub in subcommands() {
        let page = format!("docs/{sub}.md");
        let flags = flags_of(&sub);
        for (line, cell) in option_rows(&read(&root.join(&page))) {
            for flag in flags_in(&cell) {
                checked += 1;
                if !flags.contains(&flag) {
                    stale.push(format!("{page}:{line}: `tracer {sub}` has no {flag}: | {cell} |"));
                }
            }
        }
    }
    assert!(stale.is_empty(), "options the binary does not take:\n{}", stale.join("\n"));
    assert!(checked > 40, "only {checked} flags found in the options tables: is the table parser broken?");
}

#[test]
fn the_checks_themselves_read_markdown_and_shell_as_written() {
    // The parts above only hold if these do: a failure here is in the test.
    assert_eq!(slug("`--native-stacks`: the C frames too"), "--native-stacks-the-c-frames-too");
    assert_eq!(slug("Reading allocators' return values (`--returns`)"), "reading-allocators-return-values---returns");
    assert_eq!(anchors("# A\n\n```\n# not a heading\n```\n## A\n"), BTreeSet::from(["a".to_owned(), "a-1".to_owned()]));
    assert_eq!(links("see [x](docs/x.md#y) and `[not](a-link)`\n"), vec![(1, "docs/x.md#y".to_owned())]);
    assert_eq!(
        commands("sudo tracer bench --setup 'import json; d={\"a\": 1}' --fast # a --comment"),
        [["sudo", "tracer", "bench", "--setup", "'import json; d={\"a\": 1}'", "--fast"]]
    );
    assert_eq!(
        commands("tracer attach --pid $(pgrep -n python3) --json > out.jsonl --not-ours; ls"),
        [vec!["tracer", "attach", "--pid", "$(pgrep -n python3)", "--json"], vec!["ls"]]
    );
    let subs = ["attach".to_owned(), "stack".to_owned()];
    assert_eq!(
        invocations("tracer counts | sudo tracer stack --pid 1 --json", &subs),
        vec![("stack", vec!["--pid".to_owned(), "1".to_owned(), "--json".to_owned()])]
    );
    assert_eq!(invocations("tracer: error: tracer attach's", &subs).len(), 0, "an output line, not a command");
    assert!(mentions("`--growth` keeps it on", "--growth"));
    assert!(mentions("| `--growth FILE` |", "--growth"));
    assert!(!mentions("`--growth-folded FILE`", "--growth"));
    assert!(!mentions("--no-growth", "--growth"));
    assert_eq!(
        option_rows(
            "| option | meaning |\n|---|---|\n| `-p, --pid PID` | x |\n| `--fast` / `--rigorous` | y |\n\n| a | b |\n| `--not` | c |\n"
        ),
        vec![(3, "`-p, --pid PID`".to_owned()), (4, "`--fast` / `--rigorous`".to_owned())]
    );
    assert_eq!(flags_in("`-p, --pid PID`"), ["--pid"]);
    assert_eq!(flags_in("`--fast` / `--rigorous`"), ["--fast", "--rigorous"]);
    assert_eq!(flags_in("`--weight calls\\|bytes`"), ["--weight"]);
    let page = Page::parse("a `tracer\nattach --pid 1` b\n```\ntracer stack\n```\n");
    assert_eq!(page.code_spans(), vec![(1, "tracer attach --pid 1".to_owned())]);
    assert_eq!(page.code, vec![(4, "tracer stack".to_owned())]);
}
