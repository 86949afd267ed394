//! Warnings for environment variables that look like settings but are none.
//! A typo such as `RELAY_PROT` would otherwise leave the server on its
//! default port without a word; the warning names the setting meant.

use super::SETTINGS;

/// One warning per environment variable that looks like a setting
/// (`RELAY_` in any case) but is none, naming the closest setting when one
/// is close; sorted, so the start log reads the same on every run. Called
/// by `parse` once at start.
pub(super) fn unknown_variables(env: &[(String, String)]) -> Vec<String> {
    let mut warnings: Vec<String> = env
        .iter()
        .map(|(k, _)| k)
        .filter(|k| k.to_ascii_uppercase().starts_with("RELAY_"))
        .filter(|k| !SETTINGS.iter().any(|(name, _, _)| name == k))
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
    fn edit_distance_counts_a_swap_as_one() {
        assert_eq!(edit_distance("PROT", "PORT"), 1);
        assert_eq!(edit_distance("HOST", "HOST"), 0);
        assert_eq!(edit_distance("", "LOG"), 3);
        assert_eq!(edit_distance("MAXBODY", "MAX_BODY"), 1);
        assert_eq!(edit_distance("KITTEN", "SITTING"), 3);
    }
}
