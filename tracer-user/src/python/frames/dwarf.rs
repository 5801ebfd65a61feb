//! Every offset of every version's frame table, and every field's place in
//! the `_Py_DebugOffsets` layouts, compared with the DWARF of each build on
//! this machine kind: pyenv's 3.9.18, 3.10.13, 3.11.7, 3.12.1 and 3.13.0
//! (their own DWARF),
//! Debian's LTO 3.11 (python3.11-dbg), and the forky root's LTO 3.13 and
//! 3.14 (their -dbg packages). A build that is missing fails the test with
//! what to install.

use std::{borrow::Cow, collections::HashMap, path::Path};

use gimli::{AttributeValue, EndianSlice, RunTimeEndian, UnitOffset, constants as dw};
use object::{Object as _, ObjectSection as _};

use super::{CurrentThread, FrameLink, GilHolder, LineTableFormat};
use crate::{
    discover::debuginfo,
    python::{PythonVersion, abi_for},
};

type Reader<'a> = EndianSlice<'a, RunTimeEndian>;

/// The forky root `cargo xtask setup` makes.
const FORKY: &str = "/var/lib/tracer/forky";

/// A DIE: its unit's index and its offset in that unit.
type Die = (usize, UnitOffset);

/// The struct layouts of one DWARF file, by type name.
struct Layouts<'a> {
    dwarf: gimli::Dwarf<Reader<'a>>,
    units: Vec<gimli::Unit<Reader<'a>>>,
    /// Complete structs and unions by tag name, and typedefs by name.
    named: HashMap<String, Die>,
}

/// The DWARF sections of an ELF file, decompressed.
fn sections(data: &[u8]) -> gimli::DwarfSections<Cow<'_, [u8]>> {
    let file = object::File::parse(data).expect("an ELF file");
    gimli::DwarfSections::load(|id| -> Result<Cow<'_, [u8]>, object::Error> {
        file.section_by_name(id.name()).map_or(Ok(Cow::Borrowed(&[][..])), |s| s.uncompressed_data())
    })
    .expect("sections that decompress")
}

impl<'a> Layouts<'a> {
    fn load(sections: &'a gimli::DwarfSections<Cow<'a, [u8]>>) -> Self {
        let dwarf = sections.borrow(|s| EndianSlice::new(s, RunTimeEndian::Little));
        let mut units = Vec::new();
        let mut headers = dwarf.units();
        while let Some(header) = headers.next().expect("a unit header") {
            units.push(dwarf.unit(header).expect("a unit"));
        }
        let mut named = HashMap::new();
        for (index, unit) in units.iter().enumerate() {
            let mut entries = unit.entries();
            while let Some(entry) = entries.next_dfs().expect("a DIE") {
                let complete = match entry.tag() {
                    dw::DW_TAG_structure_type | dw::DW_TAG_union_type => {
                        entry.attr(dw::DW_AT_declaration).is_none() && entry.attr(dw::DW_AT_byte_size).is_some()
                    }
                    dw::DW_TAG_typedef => true,
                    _ => false,
                };
                if !complete {
                    continue;
                }
                let Some(name) = entry.attr_value(dw::DW_AT_name) else { continue };
                let name = dwarf.attr_string(unit, name).expect("a name").to_string_lossy().into_owned();
                // Structs win over typedefs of the same name (3.14's
                // `struct _PyInterpreterFrame`).
                let is_struct = entry.tag() != dw::DW_TAG_typedef;
                if is_struct || !named.contains_key(&name) {
                    named.insert(name, (index, entry.offset()));
                }
            }
        }
        Self { dwarf, units, named }
    }

    /// The DIE a type reference attribute names.
    fn target(&self, (unit, _): Die, value: AttributeValue<Reader<'a>>) -> Die {
        match value {
            AttributeValue::UnitRef(offset) => (unit, offset),
            AttributeValue::DebugInfoRef(offset) => self
                .units
                .iter()
                .enumerate()
                .find_map(|(i, u)| offset.to_unit_offset(&u.header).map(|o| (i, o)))
                .expect("a unit holds the referenced DIE"),
            other => panic!("unexpected type reference {other:?}"),
        }
    }

    /// `die` with typedefs, qualifiers and declarations looked through.
    fn resolve(&self, mut die: Die) -> Die {
        loop {
            let entry = self.units[die.0].entry(die.1).expect("a DIE");
            match entry.tag() {
                dw::DW_TAG_typedef | dw::DW_TAG_const_type | dw::DW_TAG_volatile_type | dw::DW_TAG_atomic_type => {
                    die = self.target(die, entry.attr_value(dw::DW_AT_type).expect("a type"));
                }
                dw::DW_TAG_structure_type | dw::DW_TAG_union_type if entry.attr(dw::DW_AT_declaration).is_some() => {
                    let name = entry.attr_value(dw::DW_AT_name).expect("a named declaration");
                    let name = self.dwarf.attr_string(&self.units[die.0], name).expect("a name").to_string_lossy();
                    die = *self.named.get(&*name).unwrap_or_else(|| panic!("no definition of {name}"));
                }
                _ => return die,
            }
        }
    }

    fn named(&self, name: &str) -> Die {
        self.resolve(*self.named.get(name).unwrap_or_else(|| panic!("no type {name} in the DWARF")))
    }

    /// `sizeof(name)`.
    fn size_of(&self, name: &str) -> u64 {
        let die = self.named(name);
        let entry = self.units[die.0].entry(die.1).expect("a DIE");
        entry.attr_value(dw::DW_AT_byte_size).and_then(|v| v.udata_value()).expect("a size")
    }

    /// `offsetof(ty, path)`, `path` a dotted member path.
    fn offset_of(&self, ty: &str, path: &str) -> u64 {
        let mut die = self.named(ty);
        let mut offset = 0;
        for member in path.split('.') {
            let unit = &self.units[die.0];
            let mut tree = unit.entries_tree(Some(die.1)).expect("a tree");
            let root = tree.root().expect("a root");
            let mut children = root.children();
            let mut found = None;
            while let Some(child) = children.next().expect("a child") {
                let entry = child.entry();
                if entry.tag() != dw::DW_TAG_member {
                    continue;
                }
                let Some(name) = entry.attr_value(dw::DW_AT_name) else { continue };
                if self.dwarf.attr_string(unit, name).expect("a name").slice() != member.as_bytes() {
                    continue;
                }
                // Members of a union have no location: they are at 0.
                let at = entry.attr_value(dw::DW_AT_data_member_location).map_or(0, |v| {
                    v.udata_value().unwrap_or_else(|| panic!("{ty}.{path}: a location that is not a constant"))
                });
                let next = self.target(die, entry.attr_value(dw::DW_AT_type).expect("a type"));
                found = Some((at, next));
                break;
            }
            let (at, next) = found.unwrap_or_else(|| panic!("{ty} has no member {path}"));
            offset += at;
            die = self.resolve(next);
        }
        offset
    }
}

/// What the table of `minor` says each offset is, as (type, member path or
/// "sizeof", value).
fn expectations(minor: u8) -> Vec<(&'static str, String, u64)> {
    let t = abi_for(1, PythonVersion { major: 3, minor, micro: 0, level: 0xF, serial: 0 }).expect("supported").frames();
    let m = |ty, path: &str, value| (ty, path.to_owned(), value);
    let (frame, code, previous, instr) = match minor {
        9 | 10 => ("PyFrameObject", "f_code", "f_back", "f_lasti"),
        11 | 12 => ("_PyInterpreterFrame", "f_code", "previous", "prev_instr"),
        _ => ("_PyInterpreterFrame", "f_executable", "previous", "instr_ptr"),
    };
    let threads_head = if minor < 11 { "tstate_head" } else { "threads.head" };
    let linetable = if t.code.lines == LineTableFormat::Lnotab { "co_lnotab" } else { "co_linetable" };
    let mut all = vec![
        m("_PyRuntimeState", "interpreters.head", t.runtime.interpreters_head),
        m("_PyRuntimeState", "main_thread", t.runtime.main_thread),
        m("PyInterpreterState", "next", t.interpreter.next),
        m("PyInterpreterState", threads_head, t.interpreter.threads_head),
        m("PyThreadState", "prev", t.thread.prev),
        m("PyThreadState", "next", t.thread.next),
        m("PyThreadState", "interp", t.thread.interp),
        m("PyThreadState", "thread_id", t.thread.thread_id),
        m(frame, code, t.frame.code),
        m(frame, previous, t.frame.previous),
        m(frame, instr, t.frame.instr),
        m("PyCodeObject", "co_filename", t.code.filename),
        m("PyCodeObject", "co_name", t.code.name),
        m("PyCodeObject", linetable, t.code.linetable),
        m("PyCodeObject", "co_firstlineno", t.code.firstlineno),
        m("PyASCIIObject", "length", t.unicode.length),
        m("PyASCIIObject", "state", t.unicode.state),
        m("PyASCIIObject", "sizeof", t.unicode.ascii_data),
        m("PyCompactUnicodeObject", "sizeof", t.unicode.compact_data),
        m("PyBytesObject", "ob_base.ob_size", t.bytes.size),
        m("PyBytesObject", "ob_sval", t.bytes.data),
        m("PyObject", "ob_type", t.ob_type),
    ];
    let optional = [
        ("PyThreadState", "native_thread_id", t.thread.native_thread_id),
        ("_PyInterpreterFrame", "owner", t.frame.owner),
        ("PyCodeObject", "co_qualname", t.code.qualname),
        ("PyCodeObject", "co_code_adaptive", t.code.code_adaptive),
        ("PyCodeObject", "_co_firsttraceable", t.code.first_traceable),
    ];
    all.extend(optional.into_iter().filter_map(|(ty, path, value)| Some(m(ty, path, value?))));
    match t.thread.frame {
        FrameLink::ViaCFrame { cframe, current_frame } => {
            all.push(m("PyThreadState", "cframe", cframe));
            all.push(m("_PyCFrame", "current_frame", current_frame));
        }
        FrameLink::Direct { current_frame } => all.push(m("PyThreadState", "current_frame", current_frame)),
        FrameLink::FrameObject { frame } => all.push(m("PyThreadState", "frame", frame)),
    }
    match t.gil {
        GilHolder::Runtime { last_holder, locked } => {
            all.push(m("_PyRuntimeState", "ceval.gil.last_holder", last_holder));
            all.push(m("_PyRuntimeState", "ceval.gil.locked", locked));
        }
        GilHolder::Interpreter { last_holder, locked } => {
            all.push(m("PyInterpreterState", "_gil.last_holder", last_holder));
            all.push(m("PyInterpreterState", "_gil.locked", locked));
        }
    }
    if let CurrentThread::GilstateCurrent { tstate_current } = t.current_thread {
        all.push(m("_PyRuntimeState", "gilstate.tstate_current", tstate_current));
    }
    let abi = abi_for(1, PythonVersion { major: 3, minor, micro: 0, level: 0xF, serial: 0 }).expect("supported");
    all.extend(crate::python::heap::dwarf_expectations(abi));
    if let Some(layout) = abi.debug_offsets_layout() {
        all.push(m("_Py_DebugOffsets", "sizeof", layout.size() as u64));
        for field in layout.fields {
            all.push(m("_Py_DebugOffsets", field, layout.offset_of(field).expect("its own field") as u64));
        }
    }
    all
}

/// Each build here: (name, minor version, its DWARF file).
fn builds() -> Vec<(&'static str, u8, std::path::PathBuf)> {
    let dwarf = |image: &str, root: &str| {
        debuginfo::locate(Path::new(image), Path::new(root), None, None)
            .unwrap_or_else(|e| panic!("{image} in {root}: {e}"))
            .unwrap_or_else(|| panic!("no DWARF for {image} in {root}: run `cargo xtask setup`"))
            .path
    };
    let pyenv = |v: &str, lib: &str| {
        let path = format!("/root/.pyenv/versions/{v}/lib/{lib}");
        assert!(Path::new(&path).is_file(), "pyenv's {path} is missing: it is part of this machine kind");
        dwarf(&path, "/")
    };
    vec![
        ("pyenv 3.9.18", 9, pyenv("3.9.18", "libpython3.9.so.1.0")),
        ("pyenv 3.10.13", 10, pyenv("3.10.13", "libpython3.10.so.1.0")),
        ("pyenv 3.11.7", 11, pyenv("3.11.7", "libpython3.11.so.1.0")),
        ("pyenv 3.12.1", 12, pyenv("3.12.1", "libpython3.12.so.1.0")),
        ("pyenv 3.13.0", 13, pyenv("3.13.0", "libpython3.13.so.1.0")),
        ("Debian 3.11", 11, dwarf("/usr/bin/python3.11", "/")),
        ("forky 3.13", 13, dwarf("/usr/bin/python3.13", FORKY)),
        ("forky 3.14", 14, dwarf("/usr/bin/python3.14", FORKY)),
    ]
}

#[test]
fn every_table_agrees_with_the_dwarf_of_every_build() {
    let mut wrong = Vec::new();
    let mut checked = 0;
    for (name, minor, path) in builds() {
        let data = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let sections = sections(&data);
        let layouts = Layouts::load(&sections);
        for (ty, path, value) in expectations(minor) {
            let actual = if path == "sizeof" { layouts.size_of(ty) } else { layouts.offset_of(ty, &path) };
            if actual != value {
                wrong.push(format!("{name}: {ty}.{path} is {actual} in the DWARF, {value} in the table"));
            }
            checked += 1;
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    assert!(checked > 200, "only {checked} offsets checked");
}
