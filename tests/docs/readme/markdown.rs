//! The shell blocks of the README and of each page of `docs/src/`, read
//! into commands with their expectations,
//! following the conventions described at the top of `tests/docs/readme.rs`.

/// One ```` ```sh ```` block to run.
#[derive(Debug, Clone)]
pub struct Block {
    /// Line of the opening fence in its file.
    pub line: usize,
    /// `Some(N)` when the block starts with a `# terminal N` comment.
    pub terminal: Option<u32>,
    pub commands: Vec<Cmd>,
    /// The block as written, for failure messages.
    pub text: String,
}

/// One command of a block: one line, or several joined by a trailing `\`.
#[derive(Debug, Clone)]
pub struct Cmd {
    /// Line where the command starts in its file.
    pub line: usize,
    /// The command's lines as written, without a trailing `&`.
    pub text: String,
    pub expect: Option<Expect>,
    /// Ends with `&`: started in the background.
    pub background: bool,
}

/// What a `# -> ` comment says a command prints.
#[derive(Debug, Clone, PartialEq)]
pub struct Expect {
    /// `# -> 401 ...`: the HTTP status of a `curl` command.
    pub status: Option<u16>,
    /// Matched against each line of stdout; `...` stands for any text.
    pub pattern: String,
}

/// Every `sh` block of `readme` that is to run, in order. A block whose
/// fence says `sh skip: REASON` is left out; one that says `skip` without a
/// reason is an error, as is an unclosed fence.
pub fn sh_blocks(readme: &str) -> Result<Vec<Block>, String> {
    let lines: Vec<&str> = readme.lines().collect();
    let mut blocks = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let Some(info) = lines[i].strip_prefix("```") else {
            i += 1;
            continue;
        };
        let start = i;
        let end = (start + 1..lines.len())
            .find(|&j| lines[j].trim_end() == "```")
            .ok_or(format!("line {}: unclosed code fence", start + 1))?;
        i = end + 1;
        let mut words = info.split_whitespace();
        if words.next() != Some("sh") {
            continue;
        }
        match words.next() {
            None => blocks.push(parse_block(start + 1, &lines[start + 1..end])?),
            Some("skip:") if words.next().is_some() => {}
            Some(other) => {
                return Err(format!(
                    "line {}: the fence says {other:?}: only `sh` or `sh skip: REASON`",
                    start + 1
                ));
            }
        }
    }
    Ok(blocks)
}

/// Reads one block's lines (`fence` is the line of its opening fence).
fn parse_block(fence: usize, body: &[&str]) -> Result<Block, String> {
    let terminal = body.first().and_then(|l| terminal_marker(l));
    let mut commands: Vec<Cmd> = Vec::new();
    // Whether the line before was a command's last line.
    let mut after_command = false;
    let mut i = 0;
    while i < body.len() {
        let line = body[i].trim();
        let at = fence + 1 + i;
        i += 1;
        if let Some(comment) = line.strip_prefix('#') {
            if let Some(text) = comment.trim_start().strip_prefix("->") {
                let last = commands
                    .last_mut()
                    .filter(|c| after_command && c.expect.is_none());
                let cmd = last.ok_or(format!(
                    "line {at}: `# ->` must follow a command that has none yet"
                ))?;
                cmd.expect = Some(parse_expect(text));
            }
            after_command = false;
            continue;
        }
        after_command = !line.is_empty();
        if line.is_empty() {
            continue;
        }
        let mut text = body[i - 1].to_string();
        while text.ends_with('\\') && i < body.len() {
            text.push('\n');
            text.push_str(body[i]);
            i += 1;
        }
        commands.push(command(at, text));
    }
    Ok(Block {
        line: fence,
        terminal,
        commands,
        text: body.join("\n"),
    })
}

/// `N` of a `# terminal N` line (`# terminal 2: a web client` counts).
fn terminal_marker(line: &str) -> Option<u32> {
    let rest = line.trim().strip_prefix("# terminal ")?;
    let digits: String = rest.chars().take_while(|c| c.is_ascii_digit()).collect();
    digits.parse().ok()
}

/// A command from its lines: the expectation at the end of its last line,
/// and the `&` that sends it to the background, are taken out of it.
fn command(line: usize, mut text: String) -> Cmd {
    let last_start = text.rfind('\n').map_or(0, |p| p + 1);
    let (code, comment) = split_comment(&text[last_start..]);
    let expect = comment
        .and_then(|c| c.trim_start().strip_prefix("->"))
        .map(parse_expect);
    let code = code.trim_end();
    let background = code.ends_with('&') && !code.ends_with("&&");
    let keep = if background {
        code[..code.len() - 1].trim_end()
    } else {
        code
    };
    text.truncate(last_start + keep.len());
    Cmd {
        line,
        text,
        expect,
        background,
    }
}

/// Splits a shell line into its code and its trailing comment: a `#` that
/// starts a word outside quotes.
pub fn split_comment(line: &str) -> (&str, Option<&str>) {
    let (mut single, mut double, mut escaped) = (false, false, false);
    let mut prev = ' ';
    for (i, c) in line.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' if !single => escaped = true,
            '\'' if !double => single = !single,
            '"' if !single => double = !double,
            '#' if !single && !double && prev.is_whitespace() => {
                return (&line[..i], Some(&line[i + 1..]));
            }
            _ => {}
        }
        prev = c;
    }
    (line, None)
}

/// `401 {"error":...}` names a status; anything else is the pattern alone.
fn parse_expect(text: &str) -> Expect {
    let text = text.trim();
    let (head, rest) = text.split_once(' ').unwrap_or((text, ""));
    match head.parse::<u16>() {
        Ok(status) if head.len() == 3 && (100..600).contains(&status) => Expect {
            status: Some(status),
            pattern: rest.trim().to_string(),
        },
        _ => Expect {
            status: None,
            pattern: text.to_string(),
        },
    }
}

/// Whether `line` matches `pattern` whole, `...` (or `…`) in the pattern
/// standing for any text. An empty pattern matches anything.
pub fn matches(pattern: &str, line: &str) -> bool {
    if pattern.is_empty() {
        return true;
    }
    let pattern = pattern.replace('…', "...");
    let pieces: Vec<&str> = pattern.split("...").collect();
    let (first, last) = (pieces[0], pieces[pieces.len() - 1]);
    if pieces.len() == 1 {
        return line == first;
    }
    let fits = line.len() >= first.len() + last.len();
    if !fits || !line.starts_with(first) || !line.ends_with(last) {
        return false;
    }
    let mut rest = &line[first.len()..line.len() - last.len()];
    for piece in &pieces[1..pieces.len() - 1] {
        match rest.find(piece) {
            Some(at) => rest = &rest[at + piece.len()..],
            None => return false,
        }
    }
    true
}

/// Whether a command runs the server: `relay` (after any `VAR=value`
/// words) with no subcommand, as `relay` itself decides.
pub fn is_server(text: &str) -> bool {
    let mut words = text.split_whitespace().skip_while(|w| is_assignment(w));
    if words.next() != Some("relay") {
        return false;
    }
    !matches!(
        words.next(),
        Some(
            "agent"
                | "send"
                | "ask"
                | "reply"
                | "health"
                | "token"
                | "key"
                | "pair"
                | "-h"
                | "--help"
                | "-V"
                | "--version"
        )
    )
}

fn is_assignment(word: &str) -> bool {
    word.split_once('=').is_some_and(|(name, _)| {
        !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_match_whole_lines_with_gaps() {
        assert!(matches("HELLO", "HELLO"));
        assert!(!matches("HELLO", "HELLO!"));
        assert!(matches(r#"{"ok":true,...}"#, r#"{"ok":true,"n":1}"#));
        assert!(!matches(r#"{"ok":true,...}"#, r#"{"ok":false,"n":1}"#));
        assert!(matches("a...b...c", "a-b-c"));
        assert!(!matches("a...b...c", "a-c-b"));
        assert!(!matches("ab...ba", "aba"));
        assert!(matches("x…z", "xyz"));
    }

    #[test]
    fn blocks_commands_and_expectations() {
        let readme = "text\n```sh skip: not here\nrm -rf /\n```\n```sh\n# terminal 2: x\n\
                      websocat ws://h/ws/d\n# -> {\"a\":1}\n```\n```sh\ncurl -s \\\n  -d '#x' \\\n  \
                      http://h/p   # -> 401 {...}\nrelay 2>log &   # the server\n```\n";
        let blocks = sh_blocks(readme).unwrap();
        assert_eq!(blocks.len(), 2);
        assert_eq!(blocks[0].terminal, Some(2));
        assert_eq!(
            blocks[0].commands[0].expect.as_ref().unwrap().pattern,
            "{\"a\":1}"
        );
        let curl = &blocks[1].commands[0];
        assert_eq!(curl.text.lines().count(), 3);
        assert_eq!(curl.expect.as_ref().unwrap().status, Some(401));
        let server = &blocks[1].commands[1];
        assert!(server.background && server.text == "relay 2>log");
        assert!(is_server(&server.text));
    }

    #[test]
    fn fences_must_say_why_they_skip() {
        assert!(sh_blocks("```sh skip:\nx\n```\n").is_err());
        assert!(sh_blocks("```sh later\nx\n```\n").is_err());
        assert!(sh_blocks("```sh\nx\n").is_err());
    }

    #[test]
    fn servers_are_relay_without_a_subcommand() {
        assert!(is_server("relay"));
        assert!(is_server("RELAY_LOG=debug relay --port 1"));
        assert!(!is_server("relay agent --session s -- cat"));
        assert!(!is_server("relay ask --choice yes Go?"));
        assert!(!is_server("relay --version"));
        assert!(!is_server("curl relay"));
    }
}
