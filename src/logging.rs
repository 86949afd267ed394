//! The log backend. `text` goes through simple_logger, with each event's
//! fields appended as `key=value`; `json` writes one object per line:
//! `{"ts":…,"level":"info","event":"prompt stored","session_id":…}`. Both
//! write to stderr.

use std::fmt::Write as _;
use std::io::Write as _;

use log::kv::{Key, Value, VisitSource};
use log::{LevelFilter, Log, Metadata, Record};

use crate::config::LogFormat;

struct Logger {
    level: LevelFilter,
    text: Option<simple_logger::SimpleLogger>,
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
        match &self.text {
            Some(inner) => {
                let mut fields = TextFields(String::new());
                let _ = record.key_values().visit(&mut fields);
                inner.log(
                    &Record::builder()
                        .args(format_args!("{}{}", record.args(), fields.0))
                        .level(record.level())
                        .target(record.target())
                        .module_path(record.module_path())
                        .build(),
                );
            }
            None => {
                let ts = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_millis());
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
    let text = match format {
        LogFormat::Text => Some(
            simple_logger::SimpleLogger::new()
                .with_level(level)
                .with_utc_timestamps(),
        ),
        LogFormat::Json => None,
    };
    log::set_boxed_logger(Box::new(Logger { level, text })).map_err(|e| e.to_string())?;
    log::set_max_level(level);
    Ok(())
}
