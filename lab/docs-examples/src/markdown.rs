//! Fenced code blocks of a Markdown file: what build.rs compiles and tests/docs.rs runs.
//! Shared by both through `#[path]`, so they cannot disagree on what a block is.

/// One fenced block: its language and flags (```` ```rust,no_run ```` → `rust`, `[no_run]`),
/// the 1-based line of its opening fence, and its text with the fence's indentation removed.
#[derive(Debug, Clone)]
pub struct Block {
    pub lang: String,
    pub flags: Vec<String>,
    pub line: usize,
    pub text: String,
}

impl Block {
    #[allow(dead_code)]
    pub fn has_flag(&self, flag: &str) -> bool {
        self.flags.iter().any(|f| f == flag)
    }
}

/// Every fenced block of `markdown`, in order. A fence is three or more backticks at the start
/// of a line after up to a list item's indentation; the block ends at a fence at least as long.
pub fn blocks(markdown: &str) -> Vec<Block> {
    let mut out = Vec::new();
    let mut open: Option<(usize, usize, String, Vec<String>, usize, Vec<String>)> = None;
    for (i, line) in markdown.lines().enumerate() {
        let indent = line.len() - line.trim_start().len();
        let trimmed = line.trim_start();
        let ticks = trimmed.chars().take_while(|&c| c == '`').count();
        match &mut open {
            None if ticks >= 3 => {
                let info = trimmed[ticks..].trim();
                let mut parts = info.split(',').map(|s| s.trim().to_string());
                let lang = parts.next().unwrap_or_default();
                open = Some((indent, ticks, lang, parts.collect(), i + 1, Vec::new()));
            }
            None => {}
            Some((_, fence, _, _, _, _))
                if ticks >= *fence && trimmed[ticks..].trim().is_empty() =>
            {
                let (_, _, lang, flags, line, body) = open.take().unwrap();
                out.push(Block {
                    lang,
                    flags,
                    line,
                    text: body.join("\n") + "\n",
                });
            }
            Some((indent, _, _, _, _, body)) => {
                let strip = (*indent).min(line.len() - line.trim_start().len());
                body.push(line[strip..].to_string());
            }
        }
    }
    out
}

/// The Markdown files whose examples run: README.md and every docs/*.md, sorted, as
/// paths relative to the repository root.
pub fn doc_files(root: &std::path::Path) -> Vec<String> {
    let mut files = vec!["README.md".to_string()];
    let mut docs: Vec<String> = std::fs::read_dir(root.join("docs"))
        .map(|dir| {
            dir.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.ends_with(".md"))
                .map(|n| format!("docs/{n}"))
                .collect()
        })
        .unwrap_or_default();
    docs.sort();
    files.extend(docs);
    files
}

/// A block's module name: the file's stem and the block's line (`readme_212`, `library_40`).
#[allow(dead_code)]
pub fn block_name(file: &str, line: usize) -> String {
    let stem = std::path::Path::new(file)
        .file_stem()
        .map(|s| s.to_string_lossy().to_lowercase())
        .unwrap_or_default();
    let stem: String = stem
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    format!("{stem}_{line}")
}
