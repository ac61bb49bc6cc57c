//! Every collective kind over MPI equals the in-process communicator bit for bit: runs the
//! `gshard-mpi-check` binary under `mpirun -np 4` (see its doc). Without the `mpi` feature it
//! prints a notice and passes, unless `GSHARD_REQUIRE_MPI=1` (as in `.ci/run`).

#[test]
fn every_collective_over_mpi_equals_in_process() {
    let required = std::env::var("GSHARD_REQUIRE_MPI").is_ok_and(|v| v == "1");
    #[cfg(not(feature = "mpi"))]
    {
        assert!(
            !required,
            "GSHARD_REQUIRE_MPI=1 but built without `--features mpi`"
        );
        eprintln!("skipping: built without the `mpi` feature");
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
            .output()
            .expect("mpirun (apt-get install openmpi-bin)");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(stdout.contains("; 0 mismatches"), "{stdout}");
    }
}
