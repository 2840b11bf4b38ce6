//! Plan analysis: waves, conflict pairs, critical path and maximum parallelism.
