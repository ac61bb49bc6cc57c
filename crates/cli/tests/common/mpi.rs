//! Launching ranks in the CLI tests (`mpi.rs`, `net.rs`): whether MPI runs here (a notice
//! and a pass when it does not, a failure under `GSHARD_REQUIRE_MPI=1`, which `.ci/run`
//! sets), the `mpirun` command, and running a command under a time limit.

use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// Whether a missing MPI fails the tests instead of skipping them.
pub fn required() -> bool {
    std::env::var("GSHARD_REQUIRE_MPI").is_ok_and(|v| v == "1")
}

/// Whether MPI runs here; prints why not (or fails under `GSHARD_REQUIRE_MPI=1`).
pub fn mpi_ready(test: &str) -> bool {
    let why = if !cfg!(feature = "mpi") {
        Some("built without the `mpi` feature (cargo nextest run --workspace --all-features)")
    } else if !Command::new("mpirun")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
    {
        Some("no `mpirun` on PATH (apt-get install openmpi-bin)")
    } else {
        None
    };
    match why {
        None => true,
        Some(w) => {
            assert!(!required(), "GSHARD_REQUIRE_MPI=1 but {w}");
            eprintln!("skipping {test}: {w}");
            false
        }
    }
}

/// `mpirun -np NP gshard` for tests: root allowed, more ranks than cores allowed,
/// shared-memory transport without the CMA single-copy path (which containers may forbid).
pub fn mpirun(np: usize) -> Command {
    let mut c = Command::new("mpirun");
    c.env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .env("OMPI_MCA_rmaps_base_oversubscribe", "1")
        .env("OMPI_MCA_btl_vader_single_copy_mechanism", "none")
        .args(["-np", &np.to_string(), env!("CARGO_BIN_EXE_gshard")]);
    c
}

/// Wait for `child` at most `limit`; kill it and fail the test past that.
pub fn wait(mut child: Child, limit: Duration, what: &str) -> (Output, Duration) {
    let t0 = Instant::now();
    loop {
        if child.try_wait().unwrap().is_some() {
            return (child.wait_with_output().unwrap(), t0.elapsed());
        }
        if t0.elapsed() > limit {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "{what} still running after {limit:?}; stderr:\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Run `c` to its end within `limit` (see [`wait`]), its output captured.
pub fn run(mut c: Command, limit: Duration, what: &str) -> Output {
    let child = c
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait(child, limit, what).0
}

/// The standard output of a run that succeeded; fails the test with both outputs otherwise.
pub fn ok(out: &Output, what: &str) -> String {
    assert!(
        out.status.success(),
        "{what} failed ({}):\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}
