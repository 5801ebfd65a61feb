//! A process's CPU time from `/proc/PID/stat`, for the benchmarks and the
//! soak.

use anyhow::Context as _;

/// `pid`'s user and system CPU time so far, in seconds (clock ticks).
pub fn cpu_times(pid: u32) -> anyhow::Result<(f64, f64)> {
    let stat =
        std::fs::read_to_string(format!("/proc/{pid}/stat")).with_context(|| format!("reading PID {pid}'s stat"))?;
    // Fields after the command name, which may hold spaces: utime is the
    // 14th and stime the 15th of the whole line.
    let fields: Vec<&str> = stat.rsplit_once(')').context("a stat line")?.1.split_whitespace().collect();
    let tick = |i: usize, what: &str| -> anyhow::Result<u64> {
        Ok(fields.get(i).with_context(|| format!("PID {pid}'s stat has no {what}"))?.parse()?)
    };
    let (user, system) = (tick(11, "utime")?, tick(12, "stime")?);
    // SAFETY: sysconf reads a constant of the C library; it has no preconditions.
    let per_s = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    anyhow::ensure!(per_s > 0, "sysconf(_SC_CLK_TCK) failed");
    #[allow(clippy::cast_precision_loss, reason = "clock ticks, far below 2^52")]
    let seconds = |ticks: u64| ticks as f64 / per_s as f64;
    Ok((seconds(user), seconds(system)))
}

/// `pid`'s CPU time (user and system), in seconds.
pub fn cpu_s(pid: u32) -> anyhow::Result<f64> {
    let (user, system) = cpu_times(pid)?;
    Ok(user + system)
}

#[cfg(test)]
mod tests {
    /// This test's own process, after spending CPU time: its clock has
    /// moved, and a PID that is not there is an error naming it.
    #[test]
    fn reads_a_process_cpu_time() {
        let before = super::cpu_s(std::process::id()).unwrap();
        // Spin until the clock moves 50 ms, not for a span of wall time: on
        // a loaded machine (CI's tests run side by side) 100 ms of wall
        // time gave this thread 50 ms of CPU less than once.
        let spin = std::time::Instant::now();
        let mut x = 0u64;
        let mut after = before;
        while after < before + 0.05 && spin.elapsed() < std::time::Duration::from_secs(30) {
            for _ in 0..1_000_000 {
                x = std::hint::black_box(x.wrapping_add(1));
            }
            after = super::cpu_s(std::process::id()).unwrap();
        }
        assert!(after >= before + 0.05, "{before} then {after} after 30 s of spinning");
        let err = super::cpu_times(u32::MAX).unwrap_err().to_string();
        assert_eq!(err, format!("reading PID {}'s stat", u32::MAX));
    }
}
