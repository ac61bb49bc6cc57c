//! Every collective kind over MPI equals the in-process communicator bit for bit: runs the
//! `gshard-mpi-check` binary under `mpirun -np 4` (see its doc), with flat all-to-alls and
//! with two-level ones over 2 declared hosts, and with bf16 and fp8 payloads within their
//! stated error bounds. Without the `mpi` feature it prints a notice
//! and passes, unless `GSHARD_REQUIRE_MPI=1` (as in `.ci/run`).

/// Runs the check under `mpirun -np 4` with `args`; asserts it finds no mismatch and
/// returns its summary (empty when skipped).
fn check(args: &[&str]) -> String {
    let required = std::env::var("GSHARD_REQUIRE_MPI").is_ok_and(|v| v == "1");
    #[cfg(not(feature = "mpi"))]
    {
        assert!(
            !required,
            "GSHARD_REQUIRE_MPI=1 but built without `--features mpi`"
        );
        eprintln!("skipping {args:?}: built without the `mpi` feature");
        String::new()
    }
    #[cfg(feature = "mpi")]
    {
        let _ = required;
        let out = std::process::Command::new("mpirun")
            .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
            .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
            .env("OMPI_MCA_rmaps_base_oversubscribe", "1")
            .env("OMPI_MCA_btl_vader_single_copy_mechanism", "none")
            .args(["-np", "4", env!("CARGO_BIN_EXE_gshard-mpi-check")])
            .args(args)
            .output()
            .expect("mpirun (apt-get install openmpi-bin)");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(stdout.contains("; 0 mismatches"), "{stdout}");
        stdout.into_owned()
    }
}

#[test]
fn every_collective_over_mpi_equals_in_process() {
    let out = check(&[]);
    assert!(
        out.is_empty() || out.contains(" 0 compressed results inexact"),
        "{out}"
    );
}

#[test]
fn two_level_all_to_all_over_two_hosts_equals_in_process() {
    check(&["--all-to-all", "two-level", "--hosts", "2"]);
}

#[test]
fn compressed_collectives_stay_within_their_bounds() {
    let out = check(&[
        "--compress",
        "all-to-all,all-reduce",
        "--all-to-all",
        "two-level",
        "--hosts",
        "2",
    ]);
    // The operands are not all bf16 values: compression must have changed some results.
    let inexact: usize = out
        .split("checked; ")
        .nth(1)
        .and_then(|t| t.split(' ').next())
        .map_or(1, |n| n.parse().unwrap());
    assert!(inexact > 0, "{out}");
}

#[test]
fn fp8_all_to_alls_stay_within_their_bound() {
    let out = check(&["--compress", "all-to-all:fp8@a,all-reduce@b"]);
    let inexact: usize = out
        .split("checked; ")
        .nth(1)
        .and_then(|t| t.split(' ').next())
        .map_or(1, |n| n.parse().unwrap());
    assert!(inexact > 0, "{out}");
}
