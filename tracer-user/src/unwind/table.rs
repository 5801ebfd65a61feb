//! A module's `.eh_frame` as the BPF unwinder's rows: for each pc range,
//! how to find the CFA and where rbp was saved, sorted by pc, with a
//! [`rule::NONE`] row wherever no FDE covers the code.

use gimli::{
    BaseAddresses, CfaRule, CieOrFde, EhFrame, NativeEndian, RegisterRule, UnwindContext, UnwindSection as _, X86_64,
};
use object::{Object as _, ObjectSection as _};
use tracer_common::unwind::{Row, rbp, rule};

/// The CFA expression every x86-64 linker writes for `.plt` entries
/// (binutils' `elf_x86_64_eh_frame_plt`): rsp + 8 + ((rip & 15) >= 11) << 3.
const PLT_EXPRESSION: [u8; 11] = [0x77, 0x08, 0x80, 0x00, 0x3f, 0x1a, 0x3b, 0x2a, 0x33, 0x24, 0x22];

/// What the rows of one module are, or why it has none.
#[derive(Debug, Default)]
pub struct Table {
    pub rows: Vec<Row>,
    /// Rows whose rule the BPF unwinder does not follow (an expression,
    /// another CFA register), which end an unwind there.
    pub unsupported: usize,
}

/// The rows of the ELF file `data`, or why it has none a user can act on.
pub fn rows(data: &[u8]) -> Result<Table, String> {
    let file = object::File::parse(data).map_err(|e| format!("not a readable ELF file: {e}"))?;
    let Some(section) = file.section_by_name(".eh_frame") else {
        return Err("it has no .eh_frame (unwind tables)".to_owned());
    };
    let bytes = section.data().map_err(|e| format!("its .eh_frame cannot be read: {e}"))?;
    let mut bases = BaseAddresses::default().set_eh_frame(section.address());
    if let Some(text) = file.section_by_name(".text") {
        bases = bases.set_text(text.address());
    }
    if let Some(got) = file.section_by_name(".got") {
        bases = bases.set_got(got.address());
    }
    let eh_frame = EhFrame::new(bytes, NativeEndian);
    let mut ctx = UnwindContext::new();
    // Each FDE's rows, FDEs sorted by start afterwards: .eh_frame need not
    // be in address order.
    let mut fdes: Vec<(u64, u64, Vec<Row>)> = Vec::new();
    let mut unsupported = 0;
    let mut entries = eh_frame.entries(&bases);
    while let Some(entry) = entries.next().map_err(|e| format!("its .eh_frame is malformed: {e}"))? {
        let CieOrFde::Fde(partial) = entry else { continue };
        let Ok(fde) = partial.parse(EhFrame::cie_from_offset) else { continue };
        let (start, end) = (fde.initial_address(), fde.end_address());
        let Ok(mut table) = fde.rows(&eh_frame, &bases, &mut ctx) else { continue };
        let mut rows = Vec::new();
        while let Ok(Some(r)) = table.next_row() {
            let Ok(pc) = u32::try_from(r.start_address()) else {
                return Err(format!("its code lies above 4 GiB ({:#x}), past what the rows hold", r.start_address()));
            };
            let row = row_of(pc, r, &eh_frame);
            unsupported += usize::from(row.rule == rule::UNSUPPORTED);
            rows.push(row);
        }
        fdes.push((start, end, rows));
    }
    if fdes.is_empty() {
        return Err("its .eh_frame describes no function".to_owned());
    }
    fdes.sort_by_key(|f| f.0);
    let mut out: Vec<Row> = Vec::new();
    for (start, end, rows) in fdes {
        // The end row of the FDE before, where this one starts, goes.
        if let Some(last) = out.last()
            && u64::from(last.pc) >= start
            && last.rule == rule::NONE
        {
            out.pop();
        }
        for row in rows {
            if out.last().is_some_and(|l| same_rule(l, &row)) {
                continue;
            }
            out.push(row);
        }
        if let Ok(end) = u32::try_from(end) {
            out.push(Row { pc: end, rule: rule::NONE, ..Row::default() });
        }
    }
    // Equal pcs (an empty FDE): the last one holds.
    out.dedup_by(|later, earlier| {
        if later.pc == earlier.pc {
            *earlier = *later;
            true
        } else {
            false
        }
    });
    Ok(Table { rows: out, unsupported })
}

fn same_rule(a: &Row, b: &Row) -> bool {
    (a.rule, a.rbp_rule, a.rbp, a.cfa) == (b.rule, b.rbp_rule, b.rbp, b.cfa)
}

/// One row of gimli's table as the BPF unwinder's.
fn row_of<R: gimli::Reader>(pc: u32, r: &gimli::UnwindTableRow<R::Offset>, eh_frame: &EhFrame<R>) -> Row {
    let unsupported = Row { pc, rule: rule::UNSUPPORTED, ..Row::default() };
    if matches!(r.register(X86_64::RA), Some(RegisterRule::Undefined)) {
        return Row { pc, rule: rule::ROOT, ..Row::default() };
    }
    let (rule, cfa) = match r.cfa() {
        CfaRule::RegisterAndOffset { register, offset } => {
            let Ok(offset) = i32::try_from(*offset) else { return unsupported };
            match *register {
                X86_64::RSP => (rule::RSP, offset),
                X86_64::RBP => (rule::RBP, offset),
                _ => return unsupported,
            }
        }
        CfaRule::Expression(e) => {
            let Ok(expr) = e.get(eh_frame) else { return unsupported };
            let Ok(bytes) = expr.0.to_slice() else { return unsupported };
            if *bytes != PLT_EXPRESSION {
                return unsupported;
            }
            (rule::PLT, 8)
        }
    };
    let (rbp_rule, rbp) = match r.register(X86_64::RBP) {
        Some(RegisterRule::Offset(o)) => match i16::try_from(o) {
            Ok(o) => (rbp::AT_CFA, o),
            Err(_) => return unsupported,
        },
        None | Some(RegisterRule::Undefined | RegisterRule::SameValue) => (rbp::SAME, 0),
        _ => return unsupported,
    };
    Row { pc, rule, rbp_rule, rbp, cfa }
}

/// The range of `rows` that covers `lo..hi` (link-time addresses): the row
/// that holds `lo`, then every row that starts below `hi`.
#[must_use]
pub fn covering(rows: &[Row], lo: u64, hi: u64) -> (usize, usize) {
    let first = rows.partition_point(|r| u64::from(r.pc) <= lo).saturating_sub(1);
    let end = rows.partition_point(|r| u64::from(r.pc) < hi);
    (first, end.max(first))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_interpreter_has_rows_for_its_allocator() {
        let lib = "/root/.pyenv/versions/3.11.7/lib/libpython3.11.so.1.0";
        let data = std::fs::read(lib).expect("pyenv's libpython (part of this machine kind)");
        let table = rows(&data).expect("rows");
        assert!(table.rows.len() > 10_000, "{}", table.rows.len());
        assert!(table.rows.windows(2).all(|w| w[0].pc < w[1].pc), "sorted, no equal pcs");
        let file = object::File::parse(&*data).expect("ELF");
        let malloc = object::Object::dynamic_symbols(&file)
            .find(|s| object::ObjectSymbol::name(s) == Ok("PyObject_Malloc"))
            .expect("PyObject_Malloc");
        let at = object::ObjectSymbol::address(&malloc);
        let (first, _) = covering(&table.rows, at, at + 1);
        // At the entry, before anything is pushed, the CFA is rsp + 8.
        assert_eq!((table.rows[first].rule, table.rows[first].cfa), (rule::RSP, 8), "{:?}", table.rows[first]);
    }
}
