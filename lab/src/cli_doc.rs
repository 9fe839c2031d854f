//! `baton cli-reference`: the command line's reference in Markdown, walked from the clap
//! definitions in `cli.rs`, so it cannot list a flag the binary lacks or miss one it has.
//! `docs/cli.md` is its output; the test below fails when a flag changes and the file was not
//! regenerated (`baton cli-reference > docs/cli.md`).

use clap::{Arg, ArgAction, Command, CommandFactory};

/// Where the generated reference is committed.
pub const REFERENCE_PATH: &str = "docs/cli.md";

/// The whole reference, in Markdown: one section per command, depth first.
pub fn reference() -> String {
    let mut cmd = crate::cli::Cli::command();
    cmd.build();
    let mut out = String::from(
        "# baton command-line reference\n\n\
         Generated from the code by `baton cli-reference` (the clap definitions in \
         `lab/src/cli.rs` and the command modules they name); a test fails when this file \
         differs, so regenerate it with `baton cli-reference > docs/cli.md`. Durations take a \
         unit (`1500ms`, `3s`, `2m`); a bare number is milliseconds. Every `baton node` flag can \
         also be set in the node config (`--config FILE`, see \
         [the config reference](../deploy/config-reference.md)); a flag overrides the file.\n\n",
    );
    out.push_str("## Commands\n\n");
    index(&mut out, &cmd, "baton", 0);
    out.push('\n');
    section(&mut out, &cmd, "baton");
    out
}

fn visible_subcommands(cmd: &Command) -> impl Iterator<Item = &Command> {
    cmd.get_subcommands()
        .filter(|c| !c.is_hide_set() && c.get_name() != "help")
}

fn index(out: &mut String, cmd: &Command, path: &str, depth: usize) {
    for sub in visible_subcommands(cmd) {
        let full = format!("{path} {}", sub.get_name());
        out.push_str(&format!(
            "{}- [`{full}`](#{}): {}\n",
            "  ".repeat(depth),
            anchor(&full),
            first_sentence(sub)
        ));
        index(out, sub, &full, depth + 1);
    }
}

/// GitHub's heading anchor for `` ## `baton fleet up` ``.
fn anchor(heading: &str) -> String {
    heading
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            '-' | '_' => Some(c),
            c if c.is_alphanumeric() => Some(c.to_ascii_lowercase()),
            _ => None,
        })
        .collect()
}

fn about(cmd: &Command) -> String {
    cmd.get_long_about()
        .or(cmd.get_about())
        .map(|s| s.to_string())
        .unwrap_or_default()
}

fn first_sentence(cmd: &Command) -> String {
    let about = cmd.get_about().map(|s| s.to_string()).unwrap_or_default();
    one_line(&about)
}

fn one_line(text: &str) -> String {
    text.split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .replace('|', "\\|")
}

fn section(out: &mut String, cmd: &Command, path: &str) {
    out.push_str(&format!("## `{path}`\n\n"));
    let text = about(cmd);
    if !text.is_empty() {
        out.push_str(&one_line(&text));
        out.push_str("\n\n");
    }
    let mut usage = cmd.clone();
    out.push_str(&format!(
        "```text\n{}\n```\n\n",
        usage
            .render_usage()
            .to_string()
            .trim_start_matches("Usage: ")
    ));
    let args: Vec<&Arg> = cmd
        .get_arguments()
        .filter(|a| !a.is_hide_set() && !matches!(a.get_id().as_str(), "help" | "version"))
        .collect();
    if !args.is_empty() {
        out.push_str("| argument | default | description |\n| --- | --- | --- |\n");
        for arg in args {
            out.push_str(&format!(
                "| {} | {} | {} |\n",
                arg_name(arg),
                arg_default(arg),
                arg_help(arg)
            ));
        }
        out.push('\n');
    }
    let subs: Vec<&Command> = visible_subcommands(cmd).collect();
    if !subs.is_empty() {
        out.push_str("| command | what |\n| --- | --- |\n");
        for sub in &subs {
            let full = format!("{path} {}", sub.get_name());
            out.push_str(&format!(
                "| [`{}`](#{}) | {} |\n",
                sub.get_name(),
                anchor(&full),
                first_sentence(sub)
            ));
        }
        out.push('\n');
    }
    for sub in subs {
        section(out, sub, &format!("{path} {}", sub.get_name()));
    }
}

fn arg_name(arg: &Arg) -> String {
    let value = arg
        .get_value_names()
        .map(|names| {
            names
                .iter()
                .map(|n| n.to_string())
                .collect::<Vec<_>>()
                .join(" ")
        })
        .unwrap_or_else(|| arg.get_id().as_str().to_uppercase());
    let takes_value = !matches!(
        arg.get_action(),
        ArgAction::SetTrue | ArgAction::SetFalse | ArgAction::Count
    );
    let name = match (arg.get_long(), arg.get_short()) {
        (Some(long), _) if takes_value => format!("`--{long} {value}`"),
        (Some(long), _) => format!("`--{long}`"),
        (None, Some(short)) if takes_value => format!("`-{short} {value}`"),
        (None, Some(short)) => format!("`-{short}`"),
        (None, None) if arg.is_last_set() => format!("`-- {value}...`"),
        (None, None) => format!("`{value}`"),
    };
    if arg.is_required_set() && arg.get_long().is_some() {
        format!("{name} (required)")
    } else {
        name
    }
}

fn arg_default(arg: &Arg) -> String {
    let defaults: Vec<String> = arg
        .get_default_values()
        .iter()
        .map(|v| v.to_string_lossy().into_owned())
        .collect();
    if defaults.is_empty() {
        String::new()
    } else {
        format!("`{}`", defaults.join(","))
    }
}

fn arg_help(arg: &Arg) -> String {
    let mut help = arg
        .get_long_help()
        .or(arg.get_help())
        .map(|s| one_line(&s.to_string()))
        .unwrap_or_default();
    if !help.is_empty() && !help.ends_with(['.', ')', ':', '`']) {
        help.push('.');
    }
    let choices: Vec<String> = arg
        .get_possible_values()
        .iter()
        .filter(|v| !v.is_hide_set())
        .map(|v| format!("`{}`", v.get_name()))
        .collect();
    if !choices.is_empty() && !matches!(arg.get_action(), ArgAction::SetTrue | ArgAction::SetFalse)
    {
        if !help.is_empty() {
            help.push(' ');
        }
        help.push_str(&format!("One of {}.", choices.join(", ")));
    }
    if let Some(env) = arg.get_env() {
        if !help.is_empty() {
            help.push(' ');
        }
        help.push_str(&format!("Env `{}`.", env.to_string_lossy()));
    }
    if arg.get_value_delimiter() == Some(',') && !help.to_lowercase().contains("comma-separated") {
        if !help.is_empty() {
            help.push(' ');
        }
        help.push_str("Comma-separated.");
    }
    help
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_committed_reference_is_current() {
        let committed = std::fs::read_to_string(crate::repo_path(REFERENCE_PATH))
            .expect("docs/cli.md is committed");
        assert!(
            committed == reference(),
            "{REFERENCE_PATH} is stale: run `baton cli-reference > {REFERENCE_PATH}`"
        );
    }

    /// Every command and every visible flag appears in the reference, so a flag added without
    /// a regenerated file shows in the test above, and the walk cannot skip a level.
    #[test]
    fn every_command_and_flag_is_listed() {
        let text = reference();
        fn walk(cmd: &Command, path: &str, text: &str) {
            assert!(
                text.contains(&format!("## `{path}`")),
                "no section for `{path}`"
            );
            for arg in cmd.get_arguments() {
                if arg.is_hide_set() || matches!(arg.get_id().as_str(), "help" | "version") {
                    continue;
                }
                assert!(
                    arg.get_help().is_some(),
                    "`{path}` {} has no help text",
                    arg.get_id()
                );
                if let Some(long) = arg.get_long() {
                    assert!(
                        text.contains(&format!("`--{long}")),
                        "`{path}` --{long} missing"
                    );
                }
            }
            assert!(
                path == "baton" || cmd.get_about().is_some(),
                "`{path}` has no about text"
            );
            for sub in visible_subcommands(cmd) {
                walk(sub, &format!("{path} {}", sub.get_name()), text);
            }
        }
        let mut cmd = crate::cli::Cli::command();
        cmd.build();
        walk(&cmd, "baton", &text);
        assert!(text.contains("## `baton db init`") && text.contains("`--nodes NODES`"));
    }
}
