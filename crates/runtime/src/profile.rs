//! The executor's profiler: one timed event per instruction (or fused group) per device and
//! per collective, exported as Chrome trace JSON (`chrome://tracing`, Perfetto): one track
//! (`tid`) per device, complete events (`"ph": "X"`) with `ts`/`dur` in microseconds.
//!
//! Events are buffered per device inside the executor and handed over once per run, so
//! profiling adds two clock reads per step and no locking on the hot path.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::Mutex;
use std::time::Instant;

/// One timed piece of work on one device.
#[derive(Clone, Debug, PartialEq)]
pub struct TraceEvent {
    /// Mesh position (the trace track).
    pub device: usize,
    /// E.g. `dot_general %139` or `fused(max) %141`.
    pub name: String,
    /// `kernel`, `fused`, `dot`, `collective`, `send` (a sender placing its all-to-all
    /// blocks in the receivers' results, see `Communicator::shared_memory`), `param`.
    pub cat: &'static str,
    /// Start, microseconds since the profiler was created.
    pub ts_us: f64,
    pub dur_us: f64,
    /// Dense FLOPs of a dot (0 otherwise).
    pub flops: f64,
    /// Bytes written (kernels) or sent to other devices (collectives).
    pub bytes: usize,
    /// Free-form detail (the dot path, the fused ops).
    pub detail: String,
}

/// Per-name totals of a profile.
#[derive(Clone, Debug, PartialEq)]
pub struct OpTotal {
    pub cat: &'static str,
    pub count: usize,
    pub seconds: f64,
    pub flops: f64,
}

/// Collects [`TraceEvent`]s from executor runs.
pub struct Profiler {
    t0: Instant,
    events: Mutex<Vec<TraceEvent>>,
}

impl Default for Profiler {
    fn default() -> Self {
        Profiler::new()
    }
}

fn escape(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '"' => o.push_str("\\\""),
            '\\' => o.push_str("\\\\"),
            c if (c as u32) < 0x20 => {
                let _ = write!(o, "\\u{:04x}", c as u32);
            }
            c => o.push(c),
        }
    }
    o
}

impl Profiler {
    pub fn new() -> Profiler {
        Profiler {
            t0: Instant::now(),
            events: Mutex::new(Vec::new()),
        }
    }

    /// Microseconds since creation.
    pub fn now_us(&self) -> f64 {
        self.t0.elapsed().as_secs_f64() * 1e6
    }

    /// Add events (the executor calls this once per device per run).
    pub fn record(&self, evs: Vec<TraceEvent>) {
        self.events
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend(evs);
    }

    /// Every event so far, by device then start time.
    pub fn events(&self) -> Vec<TraceEvent> {
        let mut v = self
            .events
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        v.sort_by(|a, b| a.device.cmp(&b.device).then(a.ts_us.total_cmp(&b.ts_us)));
        v
    }

    /// Totals per event name (without the `%index`), e.g. all `dot_general`s together;
    /// collectives in flight under their own name (`all_to_all (in flight)`). A started
    /// collective's wait is an event under the collective's name, so `all_to_all` is all
    /// the time the devices blocked in all-to-alls, blocking ones and the waits together.
    pub fn totals(&self) -> BTreeMap<String, OpTotal> {
        let mut m: BTreeMap<String, OpTotal> = BTreeMap::new();
        for e in self.events() {
            let mut key = e.name.split(" %").next().unwrap_or(&e.name).to_string();
            if e.cat == IN_FLIGHT {
                // Time in flight overlaps other events: never summed with blocking time.
                key.push_str(" (in flight)");
            }
            let t = m.entry(key).or_insert(OpTotal {
                cat: e.cat,
                count: 0,
                seconds: 0.0,
                flops: 0.0,
            });
            t.count += 1;
            t.seconds += e.dur_us * 1e-6;
            t.flops += e.flops;
        }
        m
    }

    /// The Chrome trace JSON object: `traceEvents` with a `thread_name` metadata event per
    /// device and one `X` event per recorded event, except the collectives in flight
    /// ([`IN_FLIGHT`]: from their start to their wait, overlapping the device's compute and
    /// one another), which are async slices (`b`/`e` pairs) on their device's track.
    pub fn chrome_trace(&self) -> String {
        let evs = self.events();
        let mut devices: Vec<usize> = evs.iter().map(|e| e.device).collect();
        devices.sort_unstable();
        devices.dedup();
        let mut out = String::from("{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n");
        let mut first = true;
        let mut sep = |out: &mut String| {
            if !first {
                out.push_str(",\n");
            }
            first = false;
        };
        for d in &devices {
            sep(&mut out);
            let _ = write!(
                out,
                "{{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":0,\"tid\":{d},\"args\":{{\"name\":\"device {d}\"}}}}"
            );
            sep(&mut out);
            let _ = write!(
                out,
                "{{\"name\":\"thread_sort_index\",\"ph\":\"M\",\"pid\":0,\"tid\":{d},\"args\":{{\"sort_index\":{d}}}}}"
            );
        }
        for (id, e) in evs.iter().enumerate() {
            sep(&mut out);
            if e.cat == IN_FLIGHT {
                for (ph, ts) in [("b", e.ts_us), ("e", e.ts_us + e.dur_us)] {
                    let _ = write!(
                        out,
                        "{{\"name\":\"{}\",\"cat\":\"{}\",\"ph\":\"{ph}\",\"id\":{id},\"pid\":0,\"tid\":{},\"ts\":{ts:.3},\"args\":{{\"bytes\":{},\"detail\":\"{}\"}}}}",
                        escape(&e.name),
                        e.cat,
                        e.device,
                        e.bytes,
                        escape(&e.detail)
                    );
                    if ph == "b" {
                        out.push_str(",\n");
                    }
                }
                continue;
            }
            let _ = write!(
                out,
                "{{\"name\":\"{}\",\"cat\":\"{}\",\"ph\":\"X\",\"pid\":0,\"tid\":{},\"ts\":{:.3},\"dur\":{:.3},\"args\":{{\"flops\":{},\"bytes\":{},\"detail\":\"{}\"}}}}",
                escape(&e.name),
                e.cat,
                e.device,
                e.ts_us,
                e.dur_us,
                e.flops,
                e.bytes,
                escape(&e.detail)
            );
        }
        out.push_str("\n]}\n");
        out
    }
}

/// The category of a collective's event from its start to its wait (the executor's
/// `overlap`): drawn as an async slice, since it spans other events of its device.
pub const IN_FLIGHT: &str = "in_flight";

/// One Chrome trace from several written by [`Profiler::chrome_trace`] (e.g. one per MPI
/// rank, each holding its own devices' tracks); `None` if one is not in that form.
pub fn merge_chrome_traces(traces: &[&str]) -> Option<String> {
    let mut parts = Vec::new();
    for t in traces {
        let (start, end) = (t.find('[')?, t.rfind(']')?);
        let inner = t.get(start + 1..end)?.trim();
        if !inner.is_empty() {
            parts.push(inner);
        }
    }
    Some(format!(
        "{{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n{}\n]}}\n",
        parts.join(",\n")
    ))
}
