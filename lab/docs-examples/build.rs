//! Compiles every ```rust block of README.md and docs/*.md into this crate, from the Markdown
//! itself: one module per block (`readme_212`), and a table of them that src/main.rs runs by
//! name and tests/docs.rs lists. An example that drifts from the API fails the build.

use std::fmt::Write as _;
use std::path::PathBuf;

#[path = "src/markdown.rs"]
mod markdown;

fn main() {
    let root = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap()).join("../..");
    println!("cargo:rerun-if-changed={}", root.join("docs").display());
    let mut modules = String::new();
    let mut table = String::from("pub const BLOCKS: &[BlockInfo] = &[\n");
    for file in markdown::doc_files(&root) {
        let path = root.join(&file);
        println!("cargo:rerun-if-changed={}", path.display());
        let text = std::fs::read_to_string(&path).unwrap();
        for block in markdown::blocks(&text) {
            if block.lang != "rust" {
                continue;
            }
            let name = markdown::block_name(&file, block.line);
            let has_main = block.text.contains("fn main(");
            let run = has_main && !block.has_flag("no_run");
            writeln!(
                modules,
                "#[allow(unused, dead_code, clippy::all)]\npub mod {name} {{\n// {file}:{line}\n{body}\n{runner}}}\n",
                line = block.line,
                body = block.text,
                runner = if has_main {
                    "pub fn __run() -> std::process::ExitCode { std::process::Termination::report(main()) }\n"
                } else {
                    ""
                },
            )
            .unwrap();
            writeln!(
                table,
                "    BlockInfo {{ name: {name:?}, file: {file:?}, line: {line}, run: {run}, main: {main} }},",
                line = block.line,
                main = if has_main { format!("Some({name}::__run)") } else { "None".into() },
            )
            .unwrap();
        }
    }
    table.push_str("];\n");
    let out = PathBuf::from(std::env::var("OUT_DIR").unwrap());
    std::fs::write(out.join("blocks.rs"), modules + &table).unwrap();
}
