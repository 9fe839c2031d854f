//! `docs-examples`: the docs' Rust blocks, compiled from README.md and docs/*.md by build.rs.
//! With `BATON_DOC_BLOCK=NAME` it runs that block's `main` (its arguments are this program's);
//! without, it lists every block: `NAME FILE:LINE run|compile`.

use std::process::ExitCode;

/// One compiled block.
pub struct BlockInfo {
    pub name: &'static str,
    pub file: &'static str,
    pub line: usize,
    /// A program the suite runs (a `main`, not marked `no_run`).
    pub run: bool,
    pub main: Option<fn() -> ExitCode>,
}

include!(concat!(env!("OUT_DIR"), "/blocks.rs"));

fn main() -> ExitCode {
    let Ok(wanted) = std::env::var("BATON_DOC_BLOCK") else {
        for b in BLOCKS {
            let kind = if b.run { "run" } else { "compile" };
            println!("{} {}:{} {kind}", b.name, b.file, b.line);
        }
        return ExitCode::SUCCESS;
    };
    match BLOCKS.iter().find(|b| b.name == wanted) {
        Some(BlockInfo {
            main: Some(main), ..
        }) => main(),
        Some(_) => {
            eprintln!("docs-examples: {wanted} has no main");
            ExitCode::from(2)
        }
        None => {
            eprintln!("docs-examples: no block {wanted}");
            ExitCode::from(2)
        }
    }
}
