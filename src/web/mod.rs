//! The chat page served at `GET /`: one self-contained HTML file, compiled
//! into the binary, and the headers it is served with; beside it what makes
//! it an installable app: the web app manifest, the service worker and two
//! icons. Sans-IO like `http/`: bytes and header values out, nothing else.
//!
//! The Content-Security-Policy allows the page's own inline `<script>` and
//! `<style>` blocks by their SHA-256 hashes (so an injected script would not
//! run) and connections to its own origin only; the hashes are computed from
//! the embedded page once, so editing the page never leaves a stale policy.

use crate::http::upgrade::base64;
use std::sync::OnceLock;

/// The page, as served.
pub const PAGE: &[u8] = include_bytes!("index.html");

/// `Content-Type` of the page.
pub const CONTENT_TYPE: &str = "text/html; charset=utf-8";

/// The service worker (`/sw.js`): the page's shell offline, and the
/// notifications' clicks.
pub const WORKER: &[u8] = include_bytes!("sw.js");

/// The icon for any purpose (`/icon.svg`): a rounded square, drawn at any
/// size.
pub const ICON_SVG: &[u8] = include_bytes!("icon.svg");

/// The icon that fills its square (`/icon.png`, 512 pixels, 8 shades):
/// the manifest's maskable icon, which a phone crops to its own shape, and
/// the home-screen icon of browsers that take only PNG.
pub const ICON_PNG: &[u8] = include_bytes!("icon.png");

/// `Content-Type` of the manifest.
pub const MANIFEST_TYPE: &str = "application/manifest+json";

/// The worker's policy: it fetches the shell from its own origin, nothing
/// else.
pub const WORKER_CSP: &str = "default-src 'none'; connect-src 'self'";

/// The policy of the manifest and the icons: nothing in them runs.
pub const FILE_CSP: &str = "default-src 'none'";

/// The web app manifest. `session` (a valid session id) goes into the
/// start URL's fragment, so the app opens on the conversation it was
/// installed from; `id` leaves the fragment out, so it is one app
/// whichever conversation it starts on. URLs are relative to the manifest,
/// so the page also installs behind a proxy under a prefix.
pub fn manifest(session: Option<&str>) -> Vec<u8> {
    let mut start = String::from("./");
    if let Some(sid) = session {
        // Session ids are URL-unreserved characters: nothing to escape.
        start.push('#');
        start.push_str(sid);
    }
    format!(
        "{{\"name\":\"relay\",\"short_name\":\"relay\",\
         \"description\":\"Conversations with your agents\",\"id\":\"./\",\
         \"start_url\":\"{start}\",\"scope\":\"./\",\"display\":\"standalone\",\
         \"background_color\":\"#f6f7f9\",\"theme_color\":\"#1d4ed8\",\"icons\":[\
         {{\"src\":\"icon.svg\",\"sizes\":\"any\",\"type\":\"image/svg+xml\",\"purpose\":\"any\"}},\
         {{\"src\":\"icon.png\",\"sizes\":\"512x512\",\"type\":\"image/png\",\"purpose\":\"maskable\"}}]}}"
    )
    .into_bytes()
}

/// `Cache-Control` of the page: browsers revalidate on every load, so a new
/// binary's page is seen at once (the page is small and has no validator).
pub const CACHE_CONTROL: &str = "no-cache";

/// The headers that go with the page or one of its files besides type and
/// length, with the policy `csp` (the page's is [`csp`]).
pub fn headers(csp: &'static str) -> [(&'static str, &'static str); 5] {
    [
        ("Cache-Control", CACHE_CONTROL),
        ("Content-Security-Policy", csp),
        ("X-Content-Type-Options", "nosniff"),
        ("Referrer-Policy", "no-referrer"),
        ("X-Frame-Options", "DENY"),
    ]
}

/// The page's Content-Security-Policy. `connect-src 'self'` covers `ws:` and
/// `wss:` to the same host and port (CSP Level 3, every current browser);
/// the manifest, the worker and the icons come from the page's own origin.
/// The policy is built on the first call.
pub fn csp() -> &'static str {
    static CSP: OnceLock<String> = OnceLock::new();
    CSP.get_or_init(|| {
        format!(
            "default-src 'none'; script-src {}; style-src {}; connect-src 'self'; \
             img-src 'self'; manifest-src 'self'; worker-src 'self'; base-uri 'none'; \
             form-action 'none'; frame-ancestors 'none'",
            hash_sources(PAGE, b"<script>", b"</script>"),
            hash_sources(PAGE, b"<style>", b"</style>"),
        )
    })
}

/// `'sha256-…'` for every block between `open` and `close` (space
/// separated), or `'none'` when there is none.
fn hash_sources(page: &[u8], open: &[u8], close: &[u8]) -> String {
    let mut out = Vec::new();
    let mut rest = page;
    while let Some(start) = find(rest, open) {
        let body = &rest[start + open.len()..];
        let Some(end) = find(body, close) else { break };
        out.push(format!("'sha256-{}'", base64(&sha256(&body[..end]))));
        rest = &body[end + close.len()..];
    }
    if out.is_empty() {
        "'none'".to_string()
    } else {
        out.join(" ")
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// SHA-256 (FIPS 180-4). Only the page is hashed, once per process, so a
/// plain implementation is enough and spares a dependency.
fn sha256(data: &[u8]) -> [u8; 32] {
    const K: [u32; 64] = [
        0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4,
        0xab1c5ed5, 0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe,
        0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f,
        0x4a7484aa, 0x5cb0a9dc, 0x76f988da, 0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7,
        0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc,
        0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b,
        0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070, 0x19a4c116,
        0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
        0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7,
        0xc67178f2,
    ];
    let mut h: [u32; 8] = [
        0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab,
        0x5be0cd19,
    ];
    let mut msg = data.to_vec();
    msg.push(0x80);
    while msg.len() % 64 != 56 {
        msg.push(0);
    }
    msg.extend_from_slice(&((data.len() as u64) * 8).to_be_bytes());
    for block in msg.chunks_exact(64) {
        let mut w = [0u32; 64];
        for (i, word) in block.chunks_exact(4).enumerate() {
            w[i] = u32::from_be_bytes([word[0], word[1], word[2], word[3]]);
        }
        for i in 16..64 {
            let s0 = w[i - 15].rotate_right(7) ^ w[i - 15].rotate_right(18) ^ (w[i - 15] >> 3);
            let s1 = w[i - 2].rotate_right(17) ^ w[i - 2].rotate_right(19) ^ (w[i - 2] >> 10);
            w[i] = w[i - 16]
                .wrapping_add(s0)
                .wrapping_add(w[i - 7])
                .wrapping_add(s1);
        }
        let mut v = h;
        for i in 0..64 {
            let s1 = v[4].rotate_right(6) ^ v[4].rotate_right(11) ^ v[4].rotate_right(25);
            let ch = (v[4] & v[5]) ^ (!v[4] & v[6]);
            let t1 = v[7]
                .wrapping_add(s1)
                .wrapping_add(ch)
                .wrapping_add(K[i])
                .wrapping_add(w[i]);
            let s0 = v[0].rotate_right(2) ^ v[0].rotate_right(13) ^ v[0].rotate_right(22);
            let maj = (v[0] & v[1]) ^ (v[0] & v[2]) ^ (v[1] & v[2]);
            let t2 = s0.wrapping_add(maj);
            v = [
                t1.wrapping_add(t2),
                v[0],
                v[1],
                v[2],
                v[3].wrapping_add(t1),
                v[4],
                v[5],
                v[6],
            ];
        }
        for (x, y) in h.iter_mut().zip(v) {
            *x = x.wrapping_add(y);
        }
    }
    let mut out = [0u8; 32];
    for (chunk, word) in out.chunks_exact_mut(4).zip(h) {
        chunk.copy_from_slice(&word.to_be_bytes());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manifest_is_json_and_keeps_the_session_in_its_start_url() {
        let m: serde_json::Value = serde_json::from_slice(&manifest(Some("team-1"))).unwrap();
        assert_eq!(m["start_url"], "./#team-1");
        assert_eq!(m["id"], "./");
        assert_eq!(m["display"], "standalone");
        assert_eq!(m["icons"][0]["src"], "icon.svg");
        assert_eq!(m["icons"][1]["purpose"], "maskable");
        let m: serde_json::Value = serde_json::from_slice(&manifest(None)).unwrap();
        assert_eq!(m["start_url"], "./");
        assert!(ICON_PNG.starts_with(b"\x89PNG\r\n\x1a\n"));
        assert!(ICON_SVG.starts_with(b"<svg "));
    }

    fn hex(b: &[u8]) -> String {
        b.iter().map(|x| format!("{x:02x}")).collect()
    }

    #[test]
    fn sha256_matches_known_vectors() {
        assert_eq!(
            hex(&sha256(b"")),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        assert_eq!(
            hex(&sha256(b"abc")),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        // Two blocks: the padding does not fit after 56 bytes.
        assert_eq!(
            hex(&sha256(
                b"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"
            )),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"
        );
    }

    #[test]
    fn base64_pads() {
        assert_eq!(base64(b""), "");
        assert_eq!(base64(b"f"), "Zg==");
        assert_eq!(base64(b"fo"), "Zm8=");
        assert_eq!(base64(b"foo"), "Zm9v");
        assert_eq!(base64(b"foobar"), "Zm9vYmFy");
    }

    #[test]
    fn policy_hashes_every_inline_block() {
        let page = b"<style>a{}</style><script>x()</script><p><script>y()</script>";
        assert_eq!(
            hash_sources(page, b"<script>", b"</script>"),
            format!(
                "'sha256-{}' 'sha256-{}'",
                base64(&sha256(b"x()")),
                base64(&sha256(b"y()"))
            )
        );
        assert_eq!(hash_sources(b"<p>", b"<style>", b"</style>"), "'none'");
        let csp = csp();
        assert!(csp.contains("script-src 'sha256-"), "{csp}");
        assert!(csp.contains("style-src 'sha256-"), "{csp}");
        assert!(!csp.contains("unsafe"), "{csp}");
    }

    #[test]
    fn page_is_self_contained_and_small() {
        let page = std::str::from_utf8(PAGE).expect("the page is UTF-8");
        // One small download on a phone, with encryption, Markdown,
        // streamed answers, questions, the list of conversations and
        // notifications: the budget is 80 KiB (the app's other files add
        // under 6 KiB, and the service worker keeps them all offline).
        assert!(PAGE.len() < 80 * 1024, "page is {} bytes", PAGE.len());
        let files = WORKER.len() + ICON_SVG.len() + ICON_PNG.len() + manifest(None).len();
        assert!(files < 6 * 1024, "the app's files are {files} bytes");
        // Only the app's own files, by relative paths.
        for external in ["src=", "href=\"http", "href=\"/", "@import", "url("] {
            assert!(!page.contains(external), "page loads {external}");
        }
        // Message text goes through textContent only.
        for unsafe_sink in ["innerHTML", "outerHTML", "insertAdjacentHTML", "eval("] {
            assert!(!page.contains(unsafe_sink), "page uses {unsafe_sink}");
        }
    }
}
