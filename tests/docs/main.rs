//! The documentation holds: the shell examples of the README and of the
//! book run and print what the pages say, and their links and tables are
//! complete (readme).

#[path = "../common/mod.rs"]
mod common;

mod readme;
