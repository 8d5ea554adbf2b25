//! An exact fast encoder for the byte-level BPE tokenizers of the Qwen families.
//!
//! `tokenizers` spends most of an encode in general machinery: the Oniguruma pre-tokenizer
//! regex (about half of it), per-call `Encoding` bookkeeping and offsets. The split of a
//! ~1,500-token prompt costs one to two such encodes on the critical path of every decision. For
//! a tokenizer whose pipeline is exactly the Qwen one — NFC (or no normalizer), the Qwen split
//! pattern (Qwen2 / 2.5 / 3, or Qwen3.5's, which adds marks to letters), byte-level without its
//! own regex, BPE without dropout, word prefixes / suffixes or byte fallback, added tokens
//! matched literally (no strip, no single-word rule, not normalized) — [`ByteLevelBpe`] computes
//! the same ids:
//!
//! 1. the text is cut at added tokens, leftmost-longest, as `tokenizers` cuts it (special tokens
//!    stay text when they are encoded as text);
//! 2. each remaining segment is cut at *sync points*: a space whose previous byte is printable
//!    ASCII (`!`..=`~`). Every alternative of both split patterns ends a match at such a space
//!    and starts the next one there (no alternative looks behind, and none runs from a
//!    non-space over a space), and NFC composes nothing across it, so a segment's tokens are its
//!    pieces' tokens, concatenated;
//! 3. a piece of ASCII is split by a hand-written scanner of the pattern (on ASCII both patterns
//!    are the same: letters `[A-Za-z]`, digits `[0-9]`, no marks) and each pre-token is merged
//!    by rank — the lowest rank first, the leftmost on ties, the order of `tokenizers`' merge
//!    heap — with a per-thread cache;
//! 4. a piece holding any non-ASCII byte goes through `tokenizers`' own normalizer,
//!    pre-tokenizer and model, so every Unicode class is Oniguruma's own.
//!
//! Any other pipeline is not taken ([`ByteLevelBpe::new`] gives `None`; `tokenizers` encodes).
//! Equivalence with `tokenizers` is tested over random and committed texts on the three Qwen
//! tokenizers (`engine/tests/tokenizer_fast.rs`).

use super::TokenizerError;
use ahash::AHashMap as HashMap;
use aho_corasick::{AhoCorasick, AhoCorasickBuilder, MatchKind};
use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};
use tokenizers::{
    Model, ModelWrapper, NormalizedString, Normalizer, OffsetReferential, OffsetType,
    PreTokenizedString, PreTokenizer, Tokenizer,
};

/// The split pattern of the Qwen2, Qwen2.5 and Qwen3 tokenizers.
const QWEN2_PATTERN: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// The split pattern of the Qwen3.5 tokenizer (marks count with letters).
const QWEN35_PATTERN: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Pre-tokens longer than this are merged by `tokenizers`' model (its heap is O(n log n); the
/// scan here is O(n²)) and not cached.
const MAX_FAST_WORD: usize = 64;
/// Cached pre-tokens per thread before the cache is emptied.
const CACHE_LIMIT: usize = 1 << 15;

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

thread_local! {
    /// Per thread: the encoder the cache belongs to, and pre-token bytes → token ids.
    static CACHE: RefCell<(u64, HashMap<Box<[u8]>, Box<[u32]>>)> =
        RefCell::new((0, HashMap::default()));
}

/// The fast encoder of one tokenizer (see the module docs).
#[derive(Debug)]
pub(crate) struct ByteLevelBpe {
    /// Cache key of this encoder.
    id: u64,
    /// Every added token's text, matched leftmost-longest.
    added: AhoCorasick,
    /// Per pattern of `added`: its id and whether it is special.
    added_tokens: Vec<(u32, bool)>,
    /// The id of each byte's single-byte token.
    byte_ids: [u32; 256],
    /// The byte-level alphabet: the char standing for each byte ([`byte_chars`]).
    chars: [char; 256],
    /// `(left << 32) | right` → (rank, merged id).
    merges: HashMap<u64, (u32, u32)>,
    /// `ignore_merges`: a pre-token that is itself in the vocabulary is that one token.
    whole: Option<HashMap<Box<[u8]>, u32>>,
}

/// The model's parts as `tokenizers` serializes them: merges as pairs (the current form) or as
/// `"a b"` strings (the legacy form), tried in that order.
#[derive(serde::Deserialize)]
struct BpeParts<M> {
    vocab: HashMap<String, u32>,
    merges: Vec<M>,
}

/// The merges as `(left, right)` pairs, whichever form they were serialized in.
fn bpe_parts(json: &[u8]) -> Option<(HashMap<String, u32>, Vec<(String, String)>)> {
    if let Ok(p) = serde_json::from_slice::<BpeParts<(String, String)>>(json) {
        return Some((p.vocab, p.merges));
    }
    let p = serde_json::from_slice::<BpeParts<String>>(json).ok()?;
    let merges = p
        .merges
        .iter()
        .map(|m| {
            m.split_once(' ')
                .map(|(a, b)| (a.to_string(), b.to_string()))
        })
        .collect::<Option<Vec<_>>>()?;
    Some((p.vocab, merges))
}

/// GPT-2's byte-level alphabet: the char standing for each byte.
fn byte_chars() -> [char; 256] {
    let mut out = ['\0'; 256];
    let mut next = 256u32;
    for b in 0..=255u8 {
        let printable = matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
        out[b as usize] = if printable {
            char::from(b)
        } else {
            let c = char::from_u32(next).unwrap_or('\0');
            next += 1;
            c
        };
    }
    out
}

/// Whether `tokenizers` serializes `value` as exactly `expected`.
fn serializes_as<T: serde::Serialize>(value: &T, expected: &serde_json::Value) -> bool {
    serde_json::to_value(value).is_ok_and(|v| &v == expected)
}

/// Whether the pre-tokenizer is the Qwen split followed by byte-level without its regex.
fn qwen_pre_tokenizer(hf: &Tokenizer) -> bool {
    let Some(pre) = hf.get_pre_tokenizer() else {
        return false;
    };
    let Ok(v) = serde_json::to_value(pre) else {
        return false;
    };
    let steps = match v.get("pretokenizers").and_then(|p| p.as_array()) {
        Some(s) if v.get("type").and_then(|t| t.as_str()) == Some("Sequence") && s.len() == 2 => s,
        _ => return false,
    };
    let pattern = steps[0]
        .pointer("/pattern/Regex")
        .and_then(|p| p.as_str())
        .unwrap_or("");
    let split = steps[0].get("type").and_then(|t| t.as_str()) == Some("Split")
        && (pattern == QWEN2_PATTERN || pattern == QWEN35_PATTERN)
        && steps[0].get("behavior").and_then(|b| b.as_str()) == Some("Isolated")
        && steps[0].get("invert").and_then(|i| i.as_bool()) == Some(false);
    let byte_level = steps[1].get("type").and_then(|t| t.as_str()) == Some("ByteLevel")
        && steps[1].get("add_prefix_space").and_then(|a| a.as_bool()) == Some(false)
        && steps[1].get("use_regex").and_then(|u| u.as_bool()) == Some(false);
    split && byte_level
}

impl ByteLevelBpe {
    /// The fast encoder of `hf`, when its pipeline is the one described in the module docs.
    pub(crate) fn new(hf: &Tokenizer) -> Option<ByteLevelBpe> {
        let nfc = serde_json::json!({"type": "NFC"});
        if hf.get_normalizer().is_some_and(|n| !serializes_as(n, &nfc)) || !qwen_pre_tokenizer(hf) {
            return None;
        }
        let ModelWrapper::BPE(bpe) = hf.get_model() else {
            return None;
        };
        let empty = |s: &Option<String>| s.as_deref().is_none_or(str::is_empty);
        if bpe.dropout.is_some_and(|d| d > 0.0)
            || !empty(&bpe.continuing_subword_prefix)
            || !empty(&bpe.end_of_word_suffix)
            || bpe.byte_fallback
        {
            return None;
        }
        let mut patterns = Vec::new();
        let mut added_tokens = Vec::new();
        for (id, t) in hf.get_added_tokens_decoder() {
            if t.normalized || t.lstrip || t.rstrip || t.single_word {
                return None;
            }
            if !t.content.is_empty() {
                patterns.push(t.content);
                added_tokens.push((id, t.special));
            }
        }
        let added = AhoCorasickBuilder::new()
            .match_kind(MatchKind::LeftmostLongest)
            .build(&patterns)
            .ok()?;
        let (vocab, merge_list) = bpe_parts(&serde_json::to_vec(bpe).ok()?)?;
        let chars = byte_chars();
        let mut byte_ids = [0u32; 256];
        for (b, c) in chars.iter().enumerate() {
            byte_ids[b] = *vocab.get(&c.to_string())?;
        }
        let mut merges = HashMap::with_capacity(merge_list.len());
        let mut joined = String::new();
        for (rank, (a, b)) in merge_list.iter().enumerate() {
            let (ia, ib) = (*vocab.get(a)?, *vocab.get(b)?);
            joined.clear();
            joined.push_str(a);
            joined.push_str(b);
            // a later duplicate overwrites, as in `tokenizers`' own map
            merges.insert(pair_key(ia, ib), (rank as u32, *vocab.get(&joined)?));
        }
        let whole = bpe.ignore_merges.then(|| {
            let mut of_char = HashMap::with_capacity(256);
            for (b, c) in chars.iter().enumerate() {
                of_char.insert(*c, b as u8);
            }
            vocab
                .iter()
                .filter_map(|(s, &id)| {
                    let bytes: Option<Vec<u8>> =
                        s.chars().map(|c| of_char.get(&c).copied()).collect();
                    bytes.map(|b| (b.into_boxed_slice(), id))
                })
                .collect()
        });
        Some(ByteLevelBpe {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            added,
            added_tokens,
            byte_ids,
            chars,
            merges,
            whole,
        })
    }

    /// The ids `hf.encode_fast(text, false)` gives, with special tokens matched as control tokens
    /// or (`specials_as_text`) encoded as the text of their characters.
    pub(crate) fn encode(
        &self,
        hf: &Tokenizer,
        text: &str,
        specials_as_text: bool,
    ) -> Result<Vec<u32>, TokenizerError> {
        let mut out = Vec::with_capacity(text.len() / 3 + 4);
        let mut at = 0;
        for m in self.added.find_iter(text) {
            let (id, special) = self.added_tokens[m.pattern().as_usize()];
            if specials_as_text && special {
                continue;
            }
            self.encode_segment(hf, &text[at..m.start()], &mut out)?;
            out.push(id);
            at = m.end();
        }
        self.encode_segment(hf, &text[at..], &mut out)?;
        Ok(out)
    }

    /// A text without added tokens, cut at its sync points.
    fn encode_segment(
        &self,
        hf: &Tokenizer,
        seg: &str,
        out: &mut Vec<u32>,
    ) -> Result<(), TokenizerError> {
        let bytes = seg.as_bytes();
        let mut start = 0;
        let mut ascii = true;
        for q in 0..bytes.len() {
            let b = bytes[q];
            if b >= 0x80 {
                ascii = false;
            } else if b == b' ' && q > start && (b'!'..=b'~').contains(&bytes[q - 1]) {
                self.encode_piece(hf, &seg[start..q], ascii, out)?;
                start = q;
                ascii = true;
            }
        }
        self.encode_piece(hf, &seg[start..], ascii, out)
    }

    fn encode_piece(
        &self,
        hf: &Tokenizer,
        piece: &str,
        ascii: bool,
        out: &mut Vec<u32>,
    ) -> Result<(), TokenizerError> {
        if piece.is_empty() {
            return Ok(());
        }
        if !ascii {
            return encode_by_pipeline(hf, piece, out);
        }
        let bytes = piece.as_bytes();
        let mut i = 0;
        while i < bytes.len() {
            let end = next_match(bytes, i);
            self.merge_word(hf, &bytes[i..end], out)?;
            i = end;
        }
        Ok(())
    }

    /// The tokens of one pre-token (ASCII bytes).
    fn merge_word(
        &self,
        hf: &Tokenizer,
        word: &[u8],
        out: &mut Vec<u32>,
    ) -> Result<(), TokenizerError> {
        if let Some(&id) = self.whole.as_ref().and_then(|w| w.get(word)) {
            out.push(id);
            return Ok(());
        }
        if word.len() > MAX_FAST_WORD {
            return encode_word_by_model(hf, &self.chars, word, out);
        }
        let hit = CACHE.with(|c| {
            let c = c.borrow();
            (c.0 == self.id)
                .then(|| c.1.get(word).map(|ids| out.extend_from_slice(ids)))
                .flatten()
                .is_some()
        });
        if hit {
            return Ok(());
        }
        let mut syms: Vec<u32> = word.iter().map(|&b| self.byte_ids[b as usize]).collect();
        loop {
            let mut best: Option<(u32, usize, u32)> = None;
            for i in 0..syms.len().saturating_sub(1) {
                if let Some(&(rank, joined)) = self.merges.get(&pair_key(syms[i], syms[i + 1])) {
                    if best.is_none_or(|(r, _, _)| rank < r) {
                        best = Some((rank, i, joined));
                    }
                }
            }
            match best {
                Some((_, i, joined)) => {
                    syms[i] = joined;
                    syms.remove(i + 1);
                }
                None => break,
            }
        }
        out.extend_from_slice(&syms);
        CACHE.with(|c| {
            let mut c = c.borrow_mut();
            if c.0 != self.id || c.1.len() >= CACHE_LIMIT {
                c.0 = self.id;
                c.1.clear();
            }
            c.1.insert(word.into(), syms.into_boxed_slice());
        });
        Ok(())
    }
}

fn pair_key(a: u32, b: u32) -> u64 {
    ((a as u64) << 32) | b as u64
}

fn encode_error(e: impl std::fmt::Display) -> TokenizerError {
    TokenizerError::Encode {
        reason: e.to_string(),
    }
}

/// `tokenizers`' own normalizer, pre-tokenizer and model over `piece` (no added tokens in it).
fn encode_by_pipeline(
    hf: &Tokenizer,
    piece: &str,
    out: &mut Vec<u32>,
) -> Result<(), TokenizerError> {
    let mut normalized = NormalizedString::from(piece);
    if let Some(n) = hf.get_normalizer() {
        n.normalize(&mut normalized).map_err(encode_error)?;
    }
    let mut pre = PreTokenizedString::from(normalized);
    if let Some(p) = hf.get_pre_tokenizer() {
        p.pre_tokenize(&mut pre).map_err(encode_error)?;
    }
    for (s, _, _) in pre.get_splits(OffsetReferential::Original, OffsetType::Byte) {
        for t in hf.get_model().tokenize(s).map_err(encode_error)? {
            out.push(t.id);
        }
    }
    Ok(())
}

/// `tokenizers`' model over one long pre-token, written in the byte-level alphabet.
fn encode_word_by_model(
    hf: &Tokenizer,
    chars: &[char; 256],
    word: &[u8],
    out: &mut Vec<u32>,
) -> Result<(), TokenizerError> {
    let s: String = word.iter().map(|&b| chars[b as usize]).collect();
    for t in hf.get_model().tokenize(&s).map_err(encode_error)? {
        out.push(t.id);
    }
    Ok(())
}

fn is_letter(b: u8) -> bool {
    b.is_ascii_alphabetic()
}

fn is_digit(b: u8) -> bool {
    b.is_ascii_digit()
}

/// `\s` on ASCII: tab, line feed, vertical tab, form feed, carriage return, space.
fn is_space(b: u8) -> bool {
    matches!(b, b'\t' | b'\n' | 0x0B | 0x0C | b'\r' | b' ')
}

fn is_newline(b: u8) -> bool {
    b == b'\r' || b == b'\n'
}

/// Neither space, letter nor digit.
fn is_other(b: u8) -> bool {
    !is_space(b) && !is_letter(b) && !is_digit(b)
}

/// End of the pattern's match at `i` in ASCII `s` (alternatives tried in order, as the regex
/// does; every byte is in some match, so the end is always past `i`).
fn next_match(s: &[u8], i: usize) -> usize {
    let n = s.len();
    let at = |k: usize| s.get(k).copied();
    let c = s[i];
    // (?i:'s|'t|'re|'ve|'m|'ll|'d)
    if c == b'\'' {
        let lower = |k: usize| at(k).map(|b| b.to_ascii_lowercase());
        match lower(i + 1) {
            Some(b's' | b't' | b'm' | b'd') => return i + 2,
            Some(b'r' | b'v') if lower(i + 2) == Some(b'e') => return i + 3,
            Some(b'l') if lower(i + 2) == Some(b'l') => return i + 3,
            _ => {}
        }
    }
    let run = |mut k: usize, class: fn(u8) -> bool| {
        while k < n && class(s[k]) {
            k += 1;
        }
        k
    };
    // [^\r\n\p{L}\p{N}]?\p{L}+
    if is_letter(c) {
        return run(i, is_letter);
    }
    if !is_newline(c) && !is_digit(c) && at(i + 1).is_some_and(is_letter) {
        return run(i + 1, is_letter);
    }
    // \p{N}
    if is_digit(c) {
        return i + 1;
    }
    // ' ?[^\s\p{L}\p{N}]+[\r\n]*'
    if c == b' ' && at(i + 1).is_some_and(is_other) {
        return run(run(i + 1, is_other), is_newline);
    }
    if is_other(c) {
        return run(run(i, is_other), is_newline);
    }
    // c is whitespace from here on
    let j = run(i, is_space);
    // \s*[\r\n]+ : up to the run's last line break
    if let Some(k) = (i..j).rev().find(|&k| is_newline(s[k])) {
        return k + 1;
    }
    // \s+(?!\S) : the run, less its last space when a non-space follows
    if j == n || j - 1 > i {
        return if j == n { j } else { j - 1 };
    }
    // \s+
    j
}
