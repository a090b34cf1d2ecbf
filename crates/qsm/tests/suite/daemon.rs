/// A `qsm journal start` daemon watching `root` into the journal at `journal`, started once
/// its watches are in place, killed when dropped (so a failed assertion leaves none behind).
struct Daemon(std::process::Child);

impl Daemon {
    fn start(journal: &std::path::Path, root: &std::path::Path) -> Daemon {
        use std::io::BufRead;
        let mut child = std::process::Command::new(assert_cmd::cargo::cargo_bin("qsm"))
            .args(["journal", "start", "--journal"])
            .arg(journal)
            .arg(root)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::inherit())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let mut lines = std::io::BufReader::new(stdout).lines();
        let first = lines.next().expect("the daemon printed nothing").unwrap();
        assert!(first.contains("watching"), "{first}");
        std::thread::spawn(move || for _ in lines {});
        Daemon(child)
    }

    fn stop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.stop();
    }
}
