//! A data directory of one test, under the temp dir, removed on drop.

use std::path::PathBuf;
use std::process::Command;

use super::unique_session;

pub struct Dir(pub PathBuf);

impl Dir {
    /// A fresh path, not created (the server makes it).
    pub fn new(name: &str) -> Dir {
        let p = std::env::temp_dir().join(format!(
            "relay-{name}-{}-{}",
            std::process::id(),
            unique_session()
        ));
        let _ = std::fs::remove_dir_all(&p);
        Dir(p)
    }

    /// [`new`](Self::new), created.
    pub fn created(name: &str) -> Dir {
        let dir = Dir::new(name);
        std::fs::create_dir_all(&dir.0).expect("data dir");
        dir
    }

    pub fn path(&self) -> &str {
        self.0.to_str().expect("UTF-8 temp path")
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        // A test may have made it read-only.
        let _ = Command::new("chmod")
            .args(["-R", "u+w"])
            .arg(&self.0)
            .status();
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
