//! Each traced process's CPU time paired with its hits read at the same
//! moment, from when tracer began counting its cost to its latest reading
//! or its end, summed over processes.

use std::collections::HashMap;

use crate::kernel::maps::ProbeReading;

/// CPU time and hits per slot, read together (of one process, or summed).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Reading {
    pub cpu_ticks: u64,
    pub calls: Vec<u64>,
    pub returns: Vec<u64>,
    /// Of `calls`, those at single-stepped sites where a probe counts
    /// them apart ([`ProbeReading::stepped`]).
    pub stepped: Vec<u64>,
}

impl Reading {
    pub(super) fn zero(slots: usize) -> Self {
        Self { cpu_ticks: 0, calls: vec![0; slots], returns: vec![0; slots], stepped: vec![0; slots] }
    }

    fn of(slots: usize, cpu_ticks: u64, hits: Option<&[ProbeReading]>) -> Self {
        let mut r = Self { cpu_ticks, ..Self::zero(slots) };
        for (slot, h) in hits.unwrap_or_default().iter().enumerate().take(slots) {
            r.calls[slot] = h.priced_calls();
            r.returns[slot] = h.returned.returns;
            r.stepped[slot] = h.stepped;
        }
        r
    }

    /// Adds what happened from `from` to `to`.
    fn add_between(&mut self, from: &Self, to: &Self) {
        self.cpu_ticks = self.cpu_ticks.saturating_add(to.cpu_ticks.saturating_sub(from.cpu_ticks));
        for (sums, (from, to)) in [
            (&mut self.calls, (&from.calls, &to.calls)),
            (&mut self.returns, (&from.returns, &to.returns)),
            (&mut self.stepped, (&from.stepped, &to.stepped)),
        ] {
            for (sum, (a, b)) in sums.iter_mut().zip(from.iter().zip(to)) {
                *sum = sum.saturating_add(b.saturating_sub(*a));
            }
        }
    }

    /// What happened from `from` to `self`.
    pub(super) fn since(&self, from: &Self) -> Self {
        let mut d = Self::zero(self.calls.len());
        d.add_between(from, self);
        d
    }

    pub(super) fn hits(&self) -> u64 {
        self.calls.iter().chain(&self.returns).fold(0, |sum, &h| sum.saturating_add(h))
    }
}

/// What `/proc/PID/stat` says of a process, in clock ticks: when it started
/// (since boot) and the CPU time it has used (user and system, over all
/// its threads, those that ended included).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProcessCpu {
    pub started: u64,
    pub cpu_ticks: u64,
}

/// A process's [`ProcessCpu`]; `None` once it is gone.
pub(super) fn read_cpu(pid: u32) -> Option<ProcessCpu> {
    let stat = procfs::process::Process::new(i32::try_from(pid).ok()?).ok()?.stat().ok()?;
    Some(ProcessCpu { started: stat.starttime, cpu_ticks: stat.utime.saturating_add(stat.stime) })
}

/// One traced process: its reading when tracer began counting its cost,
/// and its latest.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Tracked {
    started: u64,
    base: Reading,
    last: Reading,
}

/// Every traced process's CPU time and hits, paired.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Ledger {
    slots: usize,
    /// When the probes went live, in clock ticks since boot.
    attach_ticks: u64,
    processes: HashMap<u32, Tracked>,
    /// What processes whose PID another process took since added.
    retired: Reading,
}

impl Ledger {
    #[must_use]
    pub fn new(slots: usize, attach_ticks: u64) -> Self {
        Self { slots, attach_ticks, processes: HashMap::new(), retired: Reading::zero(slots) }
    }

    /// Pairs process `pid`'s hits so far (by slot, `None` for none yet)
    /// with its CPU time read now.
    pub fn observe(&mut self, pid: u32, hits: Option<&[ProbeReading]>, cpu: ProcessCpu) {
        let now = Reading::of(self.slots, cpu.cpu_ticks, hits);
        if let Some(t) = self.processes.get_mut(&pid).filter(|t| t.started == cpu.started) {
            t.last = now;
            return;
        }
        let before = self.processes.remove(&pid);
        let base = if cpu.started >= self.attach_ticks {
            // Traced from its start: all its CPU time counts, and all its
            // hits. A process that had the PID before shares its counters;
            // its hits are those it had at its last reading.
            Reading { cpu_ticks: 0, ..before.as_ref().map_or_else(|| Reading::zero(self.slots), |t| t.last.clone()) }
        } else {
            // Running before the attach, first seen now: its CPU time so
            // far is partly from before, so its hits so far go too.
            now.clone()
        };
        if let Some(t) = before {
            self.retired.add_between(&t.base, &t.last);
        }
        self.processes.insert(pid, Tracked { started: cpu.started, base, last: now });
    }

    /// Pairs process `pid`'s final hits with its CPU time at its end, from
    /// its exit records, and its start estimated from them (`cpu.started`:
    /// never earlier than the truth, and at most `slack` ticks later).
    /// Only a process traced from its start is paired so: of one that ran
    /// before the attach, threads may have ended before tracer listened,
    /// and are missing from the sum. A process known under the PID with
    /// another start is not this one, and keeps its last reading.
    pub fn ended(&mut self, pid: u32, hits: Option<&[ProbeReading]>, cpu: ProcessCpu, slack: u64) {
        let started = match self.processes.get(&pid) {
            Some(t) if t.started <= cpu.started && cpu.started - t.started <= slack => t.started,
            Some(_) => return,
            // Never read: it began and ended between two reads.
            None => cpu.started,
        };
        if started >= self.attach_ticks {
            self.observe(pid, hits, ProcessCpu { started, ..cpu });
        }
    }

    /// The CPU time and hits paired so far, summed over processes.
    #[must_use]
    pub fn paired(&self) -> Reading {
        let mut sum = self.retired.clone();
        for t in self.processes.values() {
            sum.add_between(&t.base, &t.last);
        }
        sum
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::run::cost::tests::hits;

    #[test]
    fn an_end_from_exit_records_prices_what_a_process_did_after_its_last_reading() {
        // Attached at tick 1000, a slack of 50 ticks.
        let mut ledger = Ledger::new(1, 1000);
        // Started after the attach, read once, then ended: its end's CPU
        // time and its final hits replace its last reading.
        ledger.observe(8, Some(&hits(&[40], &[0])), ProcessCpu { started: 1200, cpu_ticks: 30 });
        ledger.ended(8, Some(&hits(&[100], &[0])), ProcessCpu { started: 1203, cpu_ticks: 80 }, 50);
        assert_eq!(ledger.paired(), Reading { cpu_ticks: 80, calls: vec![100], returns: vec![0], stepped: vec![0] });
        // Begun and ended between two reads: never read, paired whole.
        ledger.ended(9, Some(&hits(&[10], &[0])), ProcessCpu { started: 1300, cpu_ticks: 5 }, 50);
        assert_eq!(ledger.paired(), Reading { cpu_ticks: 85, calls: vec![110], returns: vec![0], stepped: vec![0] });
        let before = ledger.paired();
        // Another start than the one known under the PID (beyond the slack,
        // or earlier): another process, which keeps its last reading.
        ledger.observe(10, Some(&hits(&[1], &[0])), ProcessCpu { started: 1400, cpu_ticks: 1 });
        let with_10 = ledger.paired();
        ledger.ended(10, Some(&hits(&[50], &[0])), ProcessCpu { started: 1451, cpu_ticks: 90 }, 50);
        ledger.ended(10, Some(&hits(&[50], &[0])), ProcessCpu { started: 1399, cpu_ticks: 90 }, 50);
        assert_eq!(ledger.paired(), with_10);
        assert_eq!(
            with_10.since(&before),
            Reading { cpu_ticks: 1, calls: vec![1], returns: vec![0], stepped: vec![0] }
        );
        // Running before the attach: its threads that ended before tracer
        // listened are not in the sum, so its end is not used, read or not.
        ledger.observe(7, None, ProcessCpu { started: 10, cpu_ticks: 500 });
        ledger.observe(7, Some(&hits(&[5], &[0])), ProcessCpu { started: 10, cpu_ticks: 510 });
        let with_7 = ledger.paired();
        ledger.ended(7, Some(&hits(&[9], &[0])), ProcessCpu { started: 12, cpu_ticks: 900 }, 50);
        ledger.ended(6, Some(&hits(&[9], &[0])), ProcessCpu { started: 900, cpu_ticks: 900 }, 50);
        assert_eq!(ledger.paired(), with_7);
    }
}
