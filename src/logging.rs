//! The log backend. `text` writes `2026-11-24T04:03:32.445Z INFO  [target]
//! message key=value…` (the date formatted here in a few lines, rather than
//! by a date crate whose code the static binary would carry); `json` writes
//! one object per line:
//! `{"ts":…,"level":"info","event":"prompt stored","session_id":…}`.
//! Both write to stderr.

use std::fmt::Write as _;
use std::io::Write as _;

use log::kv::{Key, Value, VisitSource};
use log::{LevelFilter, Log, Metadata, Record};

use crate::config::LogFormat;

struct Logger {
    level: LevelFilter,
    text: bool,
}

/// Collects an event's fields as ` key=value` text.
struct TextFields(String);

impl<'kvs> VisitSource<'kvs> for TextFields {
    fn visit_pair(&mut self, key: Key<'kvs>, value: Value<'kvs>) -> Result<(), log::kv::Error> {
        let _ = write!(self.0, " {key}={value}");
        Ok(())
    }
}

/// Collects an event's fields as `,"key":value` JSON.
struct JsonFields(String);

impl<'kvs> VisitSource<'kvs> for JsonFields {
    fn visit_pair(&mut self, key: Key<'kvs>, value: Value<'kvs>) -> Result<(), log::kv::Error> {
        self.0.push(',');
        self.0.push_str(&json_string(key.as_str()));
        self.0.push(':');
        match value.to_u64() {
            Some(n) => {
                let _ = write!(self.0, "{n}");
            }
            None => self.0.push_str(&json_string(&value.to_string())),
        }
        Ok(())
    }
}

fn json_string(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| "\"\"".into())
}

impl Log for Logger {
    fn enabled(&self, metadata: &Metadata) -> bool {
        metadata.level() <= self.level && metadata.target().starts_with("relay")
    }

    fn log(&self, record: &Record) {
        if !self.enabled(record.metadata()) {
            return;
        }
        let ts = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        match self.text {
            true => {
                let mut line = utc_timestamp(ts);
                let _ = write!(
                    line,
                    " {:<5} [{}] {}",
                    record.level(),
                    record.target(),
                    record.args()
                );
                let mut fields = TextFields(line);
                let _ = record.key_values().visit(&mut fields);
                fields.0.push('\n');
                let _ = std::io::stderr().lock().write_all(fields.0.as_bytes());
            }
            false => {
                let mut line = format!(
                    "{{\"ts\":{ts},\"level\":\"{}\",\"event\":{}",
                    record.level().as_str().to_ascii_lowercase(),
                    json_string(&record.args().to_string())
                );
                let mut fields = JsonFields(String::new());
                let _ = record.key_values().visit(&mut fields);
                line.push_str(&fields.0);
                line.push_str("}\n");
                let _ = std::io::stderr().lock().write_all(line.as_bytes());
            }
        }
    }

    fn flush(&self) {
        let _ = std::io::stderr().flush();
    }
}

/// Installs the logger once at start.
pub fn init(level: LevelFilter, format: LogFormat) -> Result<(), String> {
    let text = format == LogFormat::Text;
    // Installed once for the life of the process.
    let logger: &'static Logger = Box::leak(Box::new(Logger { level, text }));
    log::set_logger(logger).map_err(|e| e.to_string())?;
    log::set_max_level(level);
    Ok(())
}

/// `2026-11-24T04:03:32.445Z` for a time in unix milliseconds (UTC).
fn utc_timestamp(unix_ms: u64) -> String {
    let secs = unix_ms / 1000;
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Days since 1970-01-01 to a civil date (H. Hinnant's `civil_from_days`).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        rem / 60 % 60,
        rem % 60,
        unix_ms % 1000
    )
}

#[cfg(test)]
mod tests {
    use super::utc_timestamp;

    #[test]
    fn timestamps_are_rfc3339_utc_with_milliseconds() {
        assert_eq!(utc_timestamp(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(utc_timestamp(951_782_400_123), "2000-02-29T00:00:00.123Z");
        assert_eq!(utc_timestamp(1_795_493_012_445), "2026-11-24T04:03:32.445Z");
        assert_eq!(utc_timestamp(4_102_444_799_999), "2099-12-31T23:59:59.999Z");
    }
}
