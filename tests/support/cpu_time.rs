//! A criterion measurement that reads the benchmark thread's CPU time
//! (`CLOCK_THREAD_CPUTIME_ID`) instead of the wall clock.
//!
//! The benches run on 2 cores shared with several engineers' builds: with wall time, every
//! moment the thread waits for a core is charged to whatever it was measuring, and that noise
//! lands unevenly on the two sides of a ratio. Thread CPU time leaves the waiting out (cache
//! pollution from the neighbours remains). Reading it is a system call (a few hundred ns), paid
//! once per sample of many iterations. Elsewhere than Linux it falls back to the wall clock.

use std::time::Duration;

use criterion::measurement::{Measurement, ValueFormatter, WallTime};

/// Thread CPU time, formatted like criterion's wall time.
pub struct ThreadCpuTime;

#[cfg(target_os = "linux")]
mod clock {
    use std::time::Duration;

    #[repr(C)]
    struct Timespec {
        tv_sec: i64,
        tv_nsec: i64,
    }

    const CLOCK_THREAD_CPUTIME_ID: i32 = 3;

    unsafe extern "C" {
        fn clock_gettime(clockid: i32, tp: *mut Timespec) -> i32;
    }

    /// CPU time consumed by the calling thread.
    pub fn now() -> Duration {
        let mut ts = Timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: `ts` is a valid, writable timespec (two C longs on 64-bit Linux).
        let rc = unsafe { clock_gettime(CLOCK_THREAD_CPUTIME_ID, &mut ts) };
        assert_eq!(rc, 0, "clock_gettime(CLOCK_THREAD_CPUTIME_ID) failed");
        Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
    }
}

#[cfg(not(target_os = "linux"))]
mod clock {
    use std::sync::OnceLock;
    use std::time::{Duration, Instant};

    /// Wall time since the first call (no thread CPU clock here).
    pub fn now() -> Duration {
        static START: OnceLock<Instant> = OnceLock::new();
        START.get_or_init(Instant::now).elapsed()
    }
}

/// The calling thread's CPU time so far: subtract two readings for a span.
pub fn now() -> Duration {
    clock::now()
}

static WALL: WallTime = WallTime;

impl Measurement for ThreadCpuTime {
    type Intermediate = Duration;
    type Value = Duration;

    fn start(&self) -> Duration {
        now()
    }
    fn end(&self, start: Duration) -> Duration {
        now().saturating_sub(start)
    }
    fn add(&self, a: &Duration, b: &Duration) -> Duration {
        *a + *b
    }
    fn zero(&self) -> Duration {
        Duration::ZERO
    }
    fn to_f64(&self, d: &Duration) -> f64 {
        d.as_nanos() as f64
    }
    fn formatter(&self) -> &dyn ValueFormatter {
        // Values are nanoseconds, exactly what the wall-time formatter expects.
        WALL.formatter()
    }
}
