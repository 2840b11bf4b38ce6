//! How many flushes a scenario cost the disk NATS stores on: the block device's count of
//! completed flush requests (`/sys/dev/block/MAJ:MIN/stat`, field 16, Linux 5.5 or newer), read
//! before and after. An `fsync`/`fdatasync` of a file on a disk with a write cache ends in one
//! such request, so with `--sync always` this counts the server's syncs. The count is the
//! device's, not the server's: anything else writing to the same disk in the meantime counts too
//! (the figure is an upper bound), and a store on a device without the counter (tmpfs, an old
//! kernel) gives none.
//!
//! A scenario ends when its executions do, but the acknowledgements of its last task and result
//! messages may still be on their way, and each one removes a message from a work queue (a
//! write): [`settled`] waits for the queues to empty before the count is read, so that a
//! scenario is charged for its own writes and not the next one's.

use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use futures::StreamExt as _;
use trellis_proto::subjects;

/// Waits until the task and result work queues hold no message (every acknowledgement
/// processed), for at most `bound`; gives up quietly on a stream it cannot ask about.
pub(super) async fn settled(js: &async_nats::jetstream::Context, bound: Duration) {
    let deadline = tokio::time::Instant::now() + bound;
    for name in [subjects::TASKS_STREAM, subjects::RESULTS_STREAM] {
        let Ok(mut stream) = js.get_stream(name).await else {
            continue;
        };
        while tokio::time::Instant::now() < deadline {
            match stream.info().await {
                Ok(info) if info.state.messages > 0 => {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                _ => break,
            }
        }
    }
}

/// Waits until what earlier scenarios started is done, for at most `bound`: the work queues are
/// empty ([`settled`]) and every durable consumer of the event log and of the task logs (the
/// checkpoint-store's read model, its log index) has taken and acknowledged every message.
/// Otherwise the read model catching up on a large execution's events runs beside the next
/// scenario, and an idle one is not idle. Returns how long it waited.
pub(super) async fn quiet(js: &async_nats::jetstream::Context, bound: Duration) -> Duration {
    let start = tokio::time::Instant::now();
    settled(js, bound).await;
    let deadline = start + bound;
    for name in [subjects::EVENTS_STREAM, subjects::LOGS_STREAM] {
        let Ok(stream) = js.get_stream(name).await else {
            continue;
        };
        while tokio::time::Instant::now() < deadline {
            let busy = stream
                .consumers()
                .any(|info| async move {
                    info.is_ok_and(|info| {
                        info.config.durable_name.is_some()
                            && (info.num_pending > 0 || info.num_ack_pending > 0)
                    })
                })
                .await;
            if !busy {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    start.elapsed()
}

/// The flush counter of the block device holding a directory.
#[derive(Debug, Clone)]
pub(super) struct Flushes {
    stat: PathBuf,
}

impl Flushes {
    /// The counter of the device `dir` is on; `None` when it has none.
    pub(super) fn of(dir: &Path) -> Option<Self> {
        let dev = std::fs::metadata(dir).ok()?.dev();
        let stat = PathBuf::from(format!("/sys/dev/block/{}:{}/stat", major(dev), minor(dev)));
        let flushes = Flushes { stat };
        flushes.read()?;
        Some(flushes)
    }

    /// Completed flush requests so far.
    pub(super) fn read(&self) -> Option<u64> {
        parse(&std::fs::read_to_string(&self.stat).ok()?)
    }
}

/// The completed flush requests of a block device's `stat` line: its 16th field.
fn parse(stat: &str) -> Option<u64> {
    stat.split_whitespace().nth(15)?.parse().ok()
}

/// The major number of a `dev_t` as Linux encodes it (glibc's `gnu_dev_major`).
fn major(dev: u64) -> u64 {
    ((dev >> 8) & 0xfff) | ((dev >> 32) & !0xfff)
}

/// The minor number of a `dev_t` as Linux encodes it (glibc's `gnu_dev_minor`).
fn minor(dev: u64) -> u64 {
    (dev & 0xff) | ((dev >> 12) & !0xff)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_flush_count_is_the_sixteenth_field() {
        let line = "   29562     5502  2113130     6372    28239    16951  2310104    18601        0     \
                    5116    25601    10497       11  1004456      494     5456      133\n";
        assert_eq!(parse(line), Some(5456));
        // A kernel before 5.5 has no flush fields.
        assert_eq!(parse("1 2 3 4 5 6 7 8 9 10 11 12 13 14 15"), None);
    }

    #[test]
    fn device_numbers_decode_as_glibc_does() {
        // makedev(254, 0) and makedev(259, 65537) in glibc's encoding.
        assert_eq!((major(0xfe00), minor(0xfe00)), (254, 0));
        let dev = (259 & 0xfff) << 8 | (65537 & 0xff) | ((65537 & !0xff) << 12);
        assert_eq!((major(dev), minor(dev)), (259, 65537));
    }
}
