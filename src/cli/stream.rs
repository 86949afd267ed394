//! Streamed answers in the tools, the parts that need no socket: how
//! `relay agent` turns a command's stdout, arriving in pieces, into the
//! texts of parts.

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
}
