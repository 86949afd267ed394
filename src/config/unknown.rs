//! Warnings for environment variables that look like settings but are none.
//! A typo such as `RELAY_PROT` would otherwise leave the server on its
//! default port without a word; the warning names the setting meant. The
//! command line tools' own variables (`RELAY_URL`, ...) are no settings
//! either, but they are not typos: the server leaves them alone.

use super::{SETTINGS, flag_name};

/// The variables the command line tools read (`relay agent`, `relay
/// send`, `relay health`) or give the agent's command, beside the server's
/// settings they share (the tokens). A shell that exports them for the
/// tools may start the server too: they are known, not typos. A test in
/// `cli` keeps this list and the tools' sources in step.
pub const TOOL_VARIABLES: &[&str] = &[
    "RELAY_URL",
    "RELAY_CA",
    "RELAY_E2E_KEY",
    "RELAY_SESSION_ID",
    "RELAY_CLIENT_MSG_ID",
    "RELAY_METADATA",
    "RELAY_KILL_GRACE",
    "RELAY_CONTEXT_FILE",
];

/// Settings whose loss loses data: misspelled, the sessions would live in
/// memory (gone at the next restart) or under other Redis keys.
const STORAGE_SETTINGS: &[&str] = &[
    "RELAY_DATA_DIR",
    "RELAY_REDIS_URL",
    "RELAY_REDIS_PREFIX",
    "RELAY_REDIS_REPLICAS",
];

/// Whether `name` is one of the tools' variables (exactly as they spell it).
pub(super) fn tool_variable(name: &str) -> bool {
    TOOL_VARIABLES.contains(&name)
}

/// Variables starting with `RELAY_` that are neither a setting nor one of
/// the tools' variables.
fn unknown(env: &[(String, String)]) -> impl Iterator<Item = &String> {
    env.iter()
        .map(|(k, _)| k)
        .filter(|k| k.to_ascii_uppercase().starts_with("RELAY_"))
        .filter(|k| !SETTINGS.iter().any(|(name, _, _)| name == k) && !tool_variable(k))
}

/// The flag nearest to an unknown one (`--prot`: `--port`), by the same
/// nearness as the variables'. Called when a flag is not a setting's.
pub(super) fn closest_flag(flag: &str) -> Option<String> {
    let bare = flag.trim_start_matches('-');
    if bare.is_empty() {
        return None;
    }
    let name = format!("RELAY_{}", bare.replace('-', "_").to_ascii_uppercase());
    closest_setting(&name).map(flag_name)
}

/// An unknown variable that looks like a security setting (a token, a
/// secret, TLS): the server would start open or in clear text where the
/// operator meant it closed, so this stops it instead of warning. Called
/// by `parse` once at start.
pub(super) fn misspelled_security_setting(env: &[(String, String)]) -> Option<String> {
    let k = unknown(env).find(|k| {
        let upper = k.to_ascii_uppercase();
        upper.contains("TOKEN")
            || upper.contains("TOKN")
            || upper.contains("SECRET")
            || upper.starts_with("RELAY_TLS")
    })?;
    let hint = match closest_setting(k) {
        Some(name) => format!("; did you mean {name}?"),
        None => " (relay --help lists the settings).".to_string(),
    };
    Some(format!(
        "{k} is not a setting{hint} A misspelled security setting would leave the server \
         open, so it does not start"
    ))
}

/// An unknown variable whose closest setting is a storage one
/// (`RELAY_DATADIR`, `RELAY_REDIS_ULR`): the server would keep sessions in
/// memory and lose them at the next restart, so this stops it instead of
/// warning, as a misspelled security setting does. Called by `parse` once
/// at start.
pub(super) fn misspelled_storage_setting(env: &[(String, String)]) -> Option<String> {
    let (k, meant) = unknown(env).find_map(|k| {
        closest_setting(k)
            .filter(|s| STORAGE_SETTINGS.contains(s))
            .map(|s| (k, s))
    })?;
    Some(format!(
        "{k} is not a setting; did you mean {meant}? A misspelled storage setting would keep \
         the sessions somewhere else than meant (in memory, lost at the next restart), so \
         the server does not start"
    ))
}

/// One warning per environment variable that looks like a setting
/// (`RELAY_` in any case) but is none, naming the closest setting when one
/// is close; sorted, so the start log reads the same on every run. Called
/// by `parse` once at start.
pub(super) fn unknown_variables(env: &[(String, String)]) -> Vec<String> {
    let mut warnings: Vec<String> = unknown(env)
        .map(|k| match closest_setting(k) {
            Some(name) => format!("{k} is not a setting and is ignored; did you mean {name}?"),
            None => format!("{k} is not a setting and is ignored (relay --help lists them)"),
        })
        .collect();
    warnings.sort();
    warnings
}

/// The setting whose name is nearest to `name`, if it is near enough to be
/// the likely intent. Nearness is the edit distance, allowed up to a third
/// of the name's length after `RELAY_` (at least 2); a name that is part of
/// a setting's (`RELAY_CORS` of `RELAY_CORS_ORIGINS`) counts as one edit,
/// and a setting's name inside it (`RELAY_HOSTNAME`) is near at any
/// distance.
fn closest_setting(name: &str) -> Option<&'static str> {
    let upper = name.to_ascii_uppercase();
    let short = upper.get(6..).unwrap_or("");
    let most = (short.len() / 3).max(2);
    SETTINGS
        .iter()
        .filter_map(|(setting, _, _)| {
            let known = &setting[6..];
            let d = edit_distance(&upper, setting);
            if short.len() >= 3 && known.contains(short) {
                Some((*setting, d.min(1)))
            } else if d <= most || (known.len() >= 3 && short.contains(known)) {
                Some((*setting, d))
            } else {
                None
            }
        })
        .min_by_key(|(_, d)| *d)
        .map(|(setting, _)| setting)
}

/// Edits (insert, delete, substitute, swap two neighbours) between two
/// ASCII names: optimal string alignment distance, so a swapped pair of
/// letters (`PROT`, `PORT`) counts as one typo.
fn edit_distance(a: &str, b: &str) -> usize {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    // Three rows: two back (for swaps), previous, current.
    let mut before: Vec<usize> = vec![0; b.len() + 1];
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    let mut cur = vec![0; b.len() + 1];
    for i in 1..=a.len() {
        cur[0] = i;
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            cur[j] = (prev[j] + 1).min(cur[j - 1] + 1).min(prev[j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                cur[j] = cur[j].min(before[j - 2] + 1);
            }
        }
        std::mem::swap(&mut before, &mut prev);
        std::mem::swap(&mut prev, &mut cur);
    }
    prev[b.len()]
}

#[cfg(test)]
mod tests {
    use super::super::{Command, parse};
    use super::*;

    fn warnings(env: &[(&str, &str)]) -> Vec<String> {
        let env = env.iter().map(|(k, v)| (k.to_string(), v.to_string()));
        match parse(env, std::iter::empty()).unwrap() {
            Command::Run { warnings, .. } => warnings,
            other => panic!("expected a config, got {other:?}"),
        }
    }

    #[test]
    fn unknown_relay_variables_are_warned_about_with_the_closest_setting() {
        let w = warnings(&[
            ("RELAY_PROT", "9000"),
            ("RELAY_PORT", "9001"),
            ("RELAY_MAXBODY", "1"),
            ("relay_log_format", "json"),
            ("RELAY_PING", "5"),
            ("RELAY_QUEUE_DEPTH", "9"),
            ("RELAY_CORS", "*"),
            ("RELAY_LOG_FORMT", "json"),
            ("RELAY_HOSTNAME", "::"),
            ("HOME", "/root"),
            ("PORT", "1"),
        ]);
        assert_eq!(
            w,
            [
                "RELAY_CORS is not a setting and is ignored; did you mean RELAY_CORS_ORIGINS?",
                "RELAY_HOSTNAME is not a setting and is ignored; did you mean RELAY_HOST?",
                "RELAY_LOG_FORMT is not a setting and is ignored; did you mean RELAY_LOG_FORMAT?",
                "RELAY_MAXBODY is not a setting and is ignored; did you mean RELAY_MAX_BODY?",
                "RELAY_PING is not a setting and is ignored; did you mean RELAY_PING_INTERVAL?",
                "RELAY_PROT is not a setting and is ignored; did you mean RELAY_PORT?",
                "RELAY_QUEUE_DEPTH is not a setting and is ignored (relay --help lists them)",
                "relay_log_format is not a setting and is ignored; did you mean RELAY_LOG_FORMAT?",
            ]
        );
        assert!(warnings(&[("RELAY_PORT", "1"), ("RELAY_LOG", "warn")]).is_empty());
    }

    #[test]
    fn a_misspelled_security_setting_stops_the_server() {
        let run = |k: &str| {
            let env = [(k.to_string(), "x".to_string())];
            parse(env, std::iter::empty()).unwrap_err()
        };
        let e = run("RELAY_CLIENT_TOKN");
        assert!(e.contains("did you mean RELAY_CLIENT_TOKEN?"), "{e}");
        assert!(e.contains("does not start"), "{e}");
        assert!(run("RELAY_AGENT_TOKENS").contains("RELAY_AGENT_TOKEN?"));
        assert!(run("RELAY_TLS_CRT").contains("does not start"));
        assert!(run("RELAY_SECRET").contains("does not start"));
        // Other unknown variables are still only warned about.
        assert!(warnings(&[("RELAY_PROT", "1")]).len() == 1);
    }

    #[test]
    fn a_misspelled_storage_setting_stops_the_server() {
        let run = |k: &str| {
            let env = [(k.to_string(), "x".to_string())];
            parse(env, std::iter::empty()).unwrap_err()
        };
        for (typo, meant) in [
            ("RELAY_DATADIR", "RELAY_DATA_DIR"),
            ("RELAY_DATA_DIRECTORY", "RELAY_DATA_DIR"),
            ("RELAY_REDIS_ULR", "RELAY_REDIS_URL"),
            ("RELAY_REDIS", "RELAY_REDIS_URL"),
            ("RELAY_REDIS_PREFX", "RELAY_REDIS_PREFIX"),
        ] {
            let e = run(typo);
            assert!(e.starts_with(&format!("{typo} is not a setting")), "{e}");
            assert!(e.contains(&format!("did you mean {meant}?")), "{e}");
            assert!(e.contains("in memory, lost at the next restart"), "{e}");
        }
    }

    #[test]
    fn the_tools_variables_are_neither_warned_about_nor_fatal() {
        let env: Vec<(&str, &str)> = TOOL_VARIABLES.iter().map(|k| (*k, "x")).collect();
        assert_eq!(warnings(&env), Vec::<String>::new());
        // Without the list, RELAY_URL would read as a misspelled RELAY_REDIS_URL.
        assert_eq!(closest_setting("RELAY_URL"), Some("RELAY_REDIS_URL"));
    }

    #[test]
    fn an_unknown_flag_names_the_closest_one() {
        let e = parse(std::iter::empty(), ["--prot".to_string(), "1".to_string()]).unwrap_err();
        assert_eq!(
            e,
            "unknown argument '--prot'; did you mean --port? (see --help)"
        );
        let e = parse(std::iter::empty(), ["--quux".to_string()]).unwrap_err();
        assert_eq!(e, "unknown argument '--quux' (see --help)");
        let help = parse(std::iter::empty(), ["help".to_string()]).unwrap();
        assert!(matches!(help, Command::Help), "{help:?}");
    }

    #[test]
    fn edit_distance_counts_a_swap_as_one() {
        assert_eq!(edit_distance("PROT", "PORT"), 1);
        assert_eq!(edit_distance("HOST", "HOST"), 0);
        assert_eq!(edit_distance("", "LOG"), 3);
        assert_eq!(edit_distance("MAXBODY", "MAX_BODY"), 1);
        assert_eq!(edit_distance("KITTEN", "SITTING"), 3);
    }
}
