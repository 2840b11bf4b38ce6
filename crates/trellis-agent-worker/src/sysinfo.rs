//! What a heartbeat says about the process: host name, resident memory and CPU use, read from
//! `/proc` (Linux); elsewhere the numbers are 0.

use std::time::Instant;

/// Clock ticks per second of `/proc/<pid>/stat` times. Linux fixes `USER_HZ` at 100 in its ABI on
/// every architecture it supports, whatever the kernel's internal tick rate.
const USER_HZ: f64 = 100.0;

/// Returns the host (or pod) name.
pub(crate) fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|name| name.trim().to_owned())
        .filter(|name| !name.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "localhost".to_owned())
}

/// Returns the resident set size in bytes. Reads `VmRSS` of `/proc/self/status`, which is in
/// kibibytes, rather than `/proc/self/statm`, which is in pages whose size only `sysconf` knows.
pub(crate) fn resident_memory_bytes() -> u64 {
    let Ok(status) = std::fs::read_to_string("/proc/self/status") else {
        return 0;
    };
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|kib| kib.parse::<u64>().ok())
        .map_or(0, |kib| kib * 1024)
}

/// Returns the process's user plus system CPU time in clock ticks.
fn cpu_ticks() -> Option<u64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // The command name (field 2) may hold spaces; fields after its closing parenthesis are plain.
    let after_name = &stat[stat.rfind(')')? + 1..];
    let mut fields = after_name.split_whitespace();
    // After the name: state (3), ppid (4), ... utime is field 14 and stime field 15.
    let utime: u64 = fields.nth(11)?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some(utime + stime)
}

/// Measures CPU use between successive calls.
#[derive(Debug)]
pub(crate) struct CpuMeter {
    last_ticks: u64,
    last_at: Instant,
}

impl CpuMeter {
    pub(crate) fn new() -> CpuMeter {
        CpuMeter {
            last_ticks: cpu_ticks().unwrap_or(0),
            last_at: Instant::now(),
        }
    }

    /// Returns the CPU used since the previous call, in percent of one core.
    pub(crate) fn percent(&mut self) -> f32 {
        let ticks = cpu_ticks().unwrap_or(self.last_ticks);
        let now = Instant::now();
        let elapsed = now.duration_since(self.last_at).as_secs_f64();
        let used = ticks.saturating_sub(self.last_ticks) as f64 / USER_HZ;
        self.last_ticks = ticks;
        self.last_at = now;
        if elapsed <= 0.0 {
            return 0.0;
        }
        (used / elapsed * 100.0) as f32
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn proc_readings_are_plausible() {
        assert!(super::resident_memory_bytes() > 0);
        assert!(super::cpu_ticks().is_some());
        assert!(!super::host_name().is_empty());
        let mut meter = super::CpuMeter::new();
        assert!(meter.percent() >= 0.0);
    }
}
