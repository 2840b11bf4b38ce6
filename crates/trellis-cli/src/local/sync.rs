//! How the nats-server the local cluster starts writes to disk, and what follows from it.

/// How the nats-server Trellis starts writes JetStream's files (`--sync`); see the durability
/// table in the README.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum SyncMode {
    /// JetStream's default: written at once, flushed to disk every two minutes. A process crash
    /// loses nothing; a power cut of a single node loses up to two minutes of acknowledged work.
    #[default]
    Interval,
    /// Every write is flushed to disk before it is acknowledged (`sync_interval: always`,
    /// nats-server 2.10 or newer): a power cut loses nothing acknowledged; slower.
    Always,
}

impl SyncMode {
    /// The name `--sync` takes and the benchmarks print.
    pub fn name(self) -> &'static str {
        match self {
            Self::Interval => "interval",
            Self::Always => "always",
        }
    }

    /// The coordinator's dispatch window when none is given: a larger one when every append
    /// waits for a flush, so each flush carries more tasks.
    pub fn dispatch_window(self) -> u32 {
        match self {
            Self::Interval => trellis_coordinator::turn::DEFAULT_DISPATCH_WINDOW,
            Self::Always => trellis_coordinator::turn::SYNCED_DISPATCH_WINDOW,
        }
    }
}
