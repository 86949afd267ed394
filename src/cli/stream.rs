//! Streamed answers in the tools, the parts that need no socket: how
//! `relay agent` turns a command's stdout, arriving in pieces, into the
//! texts of parts, and how `relay send` keeps its copy of a draft from
//! `delta` frames (the contract's rule: a snapshot replaces, the next part
//! appends, anything else waits for the next snapshot or the final answer).

/// Turns stdout, read in pieces, into part texts whose concatenation is
/// always a prefix of the final answer's text (`command::answer_text`):
/// the same lossy UTF-8 decoding (one U+FFFD per invalid sequence), a
/// character split across two reads held until it is whole, and trailing
/// newlines held until text follows them, since the final answer drops
/// them.
#[derive(Debug, Default)]
pub struct Decoder {
    /// The start of a character whose other bytes have not been read yet.
    partial: Vec<u8>,
    /// Newlines at the end of the text so far, not yet handed out.
    newlines: String,
}

impl Decoder {
    /// The text `bytes` add to what was handed out so far; empty when they
    /// add nothing that can be shown yet. Called once per batch of output.
    pub fn push(&mut self, bytes: &[u8]) -> String {
        self.partial.extend_from_slice(bytes);
        let mut text = std::mem::take(&mut self.newlines);
        let mut rest = self.partial.as_slice();
        loop {
            match std::str::from_utf8(rest) {
                Ok(valid) => {
                    text.push_str(valid);
                    rest = &[];
                    break;
                }
                Err(e) => {
                    let (valid, after) = rest.split_at(e.valid_up_to());
                    text.push_str(&String::from_utf8_lossy(valid));
                    match e.error_len() {
                        // An invalid sequence: one replacement character,
                        // as `String::from_utf8_lossy` does.
                        Some(len) => {
                            text.push(char::REPLACEMENT_CHARACTER);
                            rest = after.get(len..).unwrap_or_default();
                        }
                        // A character cut by the end of the read.
                        None => {
                            rest = after;
                            break;
                        }
                    }
                }
            }
        }
        let rest_len = rest.len();
        self.partial.drain(..self.partial.len() - rest_len);
        let shown = text.trim_end_matches(['\n', '\r']).len();
        self.newlines = text.split_off(shown);
        text
    }
}

/// What a client holds of one streamed answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Draft {
    /// The number of the last part in `text`; `None` while the copy is
    /// stale (a part was missed or did not decrypt) until a snapshot.
    last_part: Option<u64>,
    /// The clear text so far.
    text: String,
}

impl Default for Draft {
    /// A draft seen for the first time: its first part is number 1.
    fn default() -> Draft {
        Draft {
            last_part: Some(0),
            text: String::new(),
        }
    }
}

impl Draft {
    /// The clear text so far.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// Applies one `delta` frame: `part` its number, `text` its clear text
    /// (`None` when it did not decrypt). Returns whether the text changed.
    /// Called for every `delta` frame of the answer.
    pub fn apply(&mut self, part: Option<u64>, snapshot: bool, text: Option<&str>) -> bool {
        match text {
            None => {
                // Nothing after this part can be appended until a snapshot
                // that opens.
                self.last_part = None;
                false
            }
            Some(text) if snapshot => {
                self.last_part = part;
                let changed = self.text != text;
                self.text = text.to_string();
                changed
            }
            Some(text) => {
                let next = self.last_part.and_then(|n| n.checked_add(1));
                if part.is_none() || part != next {
                    // A gap or a part seen twice: wait for a snapshot or
                    // the final answer.
                    self.last_part = self.last_part.filter(|n| part.is_some_and(|p| p <= *n));
                    return false;
                }
                self.last_part = part;
                self.text.push_str(text);
                !text.is_empty()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the final answer would be: `command::answer_text` for output
    /// that fits.
    fn whole(bytes: &[u8]) -> String {
        String::from_utf8_lossy(bytes)
            .trim_end_matches(['\n', '\r'])
            .to_string()
    }

    #[test]
    fn parts_are_a_prefix_of_the_answer_wherever_the_reads_end() {
        let samples: [&[u8]; 5] = [
            "héllo wörld ✓ 🦀\n\nnext\n".as_bytes(),
            b"bad \xff\xfe bytes \xe2\x82 cut \xe2\x82\xac\r\n",
            b"\xf0\x9f\xa6",
            b"\n\n\nlate text\n",
            b"",
        ];
        for sample in samples {
            for size in 1..=sample.len().max(1) {
                let mut decoder = Decoder::default();
                let mut streamed = String::new();
                for piece in sample.chunks(size) {
                    let part = decoder.push(piece);
                    streamed.push_str(&part);
                    assert!(
                        whole(sample).starts_with(&streamed),
                        "{sample:?} in reads of {size}: {streamed:?}"
                    );
                    assert!(!part.ends_with('\n'), "held back: {part:?}");
                }
                // Everything but what the answer's end would still change.
                let complete = whole(sample);
                let unfinished = complete.ends_with(char::REPLACEMENT_CHARACTER);
                assert!(unfinished || streamed == complete, "{sample:?} {size}");
            }
        }
    }

    #[test]
    fn a_draft_appends_the_next_part_and_waits_after_a_gap() {
        let mut d = Draft::default();
        assert!(d.apply(Some(1), false, Some("Hel")));
        assert!(d.apply(Some(2), false, Some("lo")));
        assert!(!d.apply(Some(2), false, Some("lo")), "seen twice");
        assert_eq!(d.text(), "Hello");
        assert!(!d.apply(Some(4), false, Some("!!")), "part 3 missed");
        assert!(!d.apply(Some(5), false, Some("??")), "still waiting");
        assert_eq!(d.text(), "Hello");
        assert!(d.apply(Some(4), true, Some("Hello, wo")), "a snapshot");
        assert!(d.apply(Some(5), false, Some("rld")));
        assert_eq!(d.text(), "Hello, world");
        assert!(!d.apply(Some(6), false, None), "does not decrypt");
        assert!(!d.apply(Some(7), false, Some("x")));
        assert!(!d.apply(None, true, Some("Hello, world")), "same text");
        assert!(!d.apply(Some(8), false, Some("x")), "no number: wait");
        assert_eq!(d.text(), "Hello, world");
    }
}
