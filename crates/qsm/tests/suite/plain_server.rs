/// A `qsm server` on a free port of 127.0.0.1 without TLS, its catalog and pool in `data`,
/// killed when dropped: the one server of the test binaries that do not include the network
/// suite (whose own `ServerProc` starts every backend, with or without TLS).
struct ServerProc {
    child: std::process::Child,
    data: std::path::PathBuf,
    url: String,
}

impl ServerProc {
    fn start(data: &std::path::Path) -> ServerProc {
        use std::io::BufRead;
        let mut child = std::process::Command::new(assert_cmd::cargo::cargo_bin("qsm"))
            .arg("server")
            .arg("--data-dir")
            .arg(data)
            .args(["--listen", "127.0.0.1:0", "--plaintext"])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::inherit())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let mut lines = std::io::BufReader::new(stdout).lines();
        let first = lines.next().expect("the server printed nothing").unwrap();
        let url = first.rsplit(' ').next().unwrap().to_owned();
        assert!(url.starts_with("http://"), "{first}");
        // Keep draining stdout so the server never blocks on it.
        std::thread::spawn(move || for _ in lines {});
        ServerProc { child, data: data.to_path_buf(), url }
    }
}

impl Drop for ServerProc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
