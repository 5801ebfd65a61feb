//! Which of a table's columns fit its pane. A figure cut on its right
//! reads as another figure (1,234,567 as 1,234; "~37,504 (≥36,210)" as
//! "~37,504 (≥3"), so a column of numbers is shown whole, as wide as its
//! widest cell, or not at all; a name may be cut (the table report has it
//! whole). The pane's title says how many columns were left out.

use ratatui::layout::Constraint;

/// One column as the pane would draw it.
#[derive(Clone, Copy, Debug)]
pub struct Want {
    /// Its constraint in a pane wide enough: `Length` for numbers, `Min`
    /// for names.
    pub width: Constraint,
    pub numeric: bool,
    /// The widest of its heading (with the sort mark) and its cells.
    pub widest: u16,
}

/// The columns shown in `width` (the pane's inside), `spacing` apart, by
/// index in their order, each with its constraint: the first (the name)
/// always, then each column of numbers left to right while it fits
/// whole, then each further name while it fits at its least width.
#[must_use]
pub fn fitting(columns: &[Want], width: u16, spacing: u16) -> Vec<(usize, Constraint)> {
    let constraint = |c: &Want| match c.width {
        Constraint::Length(n) if c.numeric => Constraint::Length(n.max(c.widest)),
        other => other,
    };
    let need = |c: &Want| match constraint(c) {
        Constraint::Length(n) | Constraint::Min(n) => n,
        _ => c.widest,
    };
    let mut shown = vec![0];
    let mut used = columns.first().map_or(0, need);
    let rest =
        (1..columns.len()).filter(|&i| columns[i].numeric).chain((1..columns.len()).filter(|&i| !columns[i].numeric));
    for i in rest {
        let more = spacing + need(&columns[i]);
        if used + more <= width {
            used += more;
            shown.push(i);
        }
    }
    shown.sort_unstable();
    shown.into_iter().filter(|&i| i < columns.len()).map(|i| (i, constraint(&columns[i]))).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const fn number(n: u16, widest: u16) -> Want {
        Want { width: Constraint::Length(n), numeric: true, widest }
    }

    const fn name(n: u16) -> Want {
        Want { width: Constraint::Min(n), numeric: false, widest: n }
    }

    #[test]
    fn numbers_are_whole_or_left_out() {
        let growth = [name(20), name(24), number(11, 9), number(11, 11), number(9, 7)];
        // Wide: everything, each number as wide as its constraint.
        let all = fitting(&growth, 120, 2);
        assert_eq!(all.iter().map(|c| c.0).collect::<Vec<_>>(), [0, 1, 2, 3, 4]);
        // 58 columns: the name, then the numbers (20 + 3 × 2 + 31 = 57),
        // before the file's name; 56, one number fewer.
        let narrow = fitting(&growth, 58, 2);
        assert_eq!(narrow.iter().map(|c| c.0).collect::<Vec<_>>(), [0, 2, 3, 4]);
        assert_eq!(narrow[1].1, Constraint::Length(11));
        assert_eq!(fitting(&growth, 56, 2).iter().map(|c| c.0).collect::<Vec<_>>(), [0, 2, 3]);
        // A cell wider than the constraint widens its column.
        let rates = [name(20), number(22, 26), number(24, 10)];
        assert_eq!(fitting(&rates, 200, 2)[1], (1, Constraint::Length(26)));
        // 20 + 2 + 26 is 48: the calls left out, the bytes (24) shown.
        assert_eq!(fitting(&rates, 47, 2).iter().map(|c| c.0).collect::<Vec<_>>(), [0, 2]);
        // Narrower than the name: the name alone, cut.
        assert_eq!(fitting(&rates, 10, 2), [(0, Constraint::Min(20))]);
    }

    /// The screen `view` draws on a terminal `width` columns wide, its
    /// lines joined.
    fn screen(view: &super::super::view::View, width: u16) -> String {
        let mut terminal = ratatui::Terminal::new(ratatui::backend::TestBackend::new(width, 40)).expect("a terminal");
        terminal.draw(|frame| view.draw(frame)).expect("drawn");
        let cells = terminal.backend().buffer().content().to_vec();
        cells
            .chunks(usize::from(width))
            .map(|row| row.iter().map(ratatui::buffer::Cell::symbol).collect::<String>() + "\n")
            .collect()
    }

    /// On a terminal too narrow for every column, each figure shown is
    /// whole (never 123,456 of 123,456,789), the columns that do not fit
    /// are left out, and the title says so; a wide one shows them all.
    #[test]
    fn a_narrow_terminal_shows_whole_figures_or_none() {
        use crate::model::heap::{Heap, HeapCost, HeapType, Totals};
        let mut attached = crate::report::examples::attached(Some(1));
        attached.mode = Some("profile".into());
        let mut view = super::super::view::View::new(&attached);
        let row = |name: &str, count: u64| HeapType {
            name: name.to_owned(),
            count,
            bytes: count * 56,
            count_change: Some(i64::try_from(count).unwrap() / 3),
            bytes_change: Some(-1_234_567_890),
        };
        let heap = Heap {
            census: 2,
            taken_s: 4.0,
            since_s: None,
            every: 1,
            types: vec![row("float", 123_456_789), row("__main__.Order", 98_765_432)],
            other: None,
            totals: Totals::default(),
            partial: Vec::new(),
            cost: HeapCost::default(),
        };
        view.update(crate::model::Snapshot { heap: Some(heap), elapsed_s: 5.0, ..Default::default() });
        let figures = ["123,456,789", "+41,152,263", "6.4 GiB", "-1.1 GiB", "98,765,432", "+32,921,810", "5.2 GiB"];
        let wide = screen(&view, 120);
        for figure in figures {
            assert!(wide.contains(figure), "{figure} in\n{wide}");
        }
        assert!(!wide.contains("hidden"), "{wide}");
        // Every column whole takes 24 + 13 + 12 + 11 + 12, 4 spaces of 2
        // and the borders: 82.
        for width in [30, 40, 50, 60, 70, 81] {
            let narrow = screen(&view, width);
            assert!(narrow.contains(" heap by type [") && narrow.contains(" hidden"), "{width}:\n{narrow}");
            // No figure cut short: where a figure's first characters are
            // shown, all of it is.
            for figure in figures {
                let prefix = &figure[..figure.len() - 2];
                assert!(!narrow.contains(prefix) || narrow.contains(figure), "{figure} cut at {width}:\n{narrow}");
            }
            // From 40 on (24 + 12 + 2 + 2), a column of figures fits.
            assert!(width < 40 || figures.iter().any(|f| narrow.contains(f)), "{width}:\n{narrow}");
        }
    }
}
