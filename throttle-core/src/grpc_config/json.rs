//! A small JSON reader for the few service-config objects we parse: no allocation, no
//! recursion past [`MAX_DEPTH`], every malformed input an error, never a panic.

use crate::error::ConfigError;
use crate::options::ConfigOption;

/// Nesting deeper than this is refused (skipped values included), so the reader's stack is
/// bounded whatever the input.
pub(super) const MAX_DEPTH: u32 = 64;

/// A cursor over the JSON text.
pub(super) struct Reader<'a> {
    s: &'a [u8],
    pos: usize,
    /// The option a malformed text is reported as.
    json: &'static ConfigOption,
}

/// A JSON string as it appears between its quotes, and whether it holds an escape (such a
/// string never equals one of our plain ASCII keys or names).
#[derive(Clone, Copy)]
pub(super) struct Str<'a> {
    pub(super) raw: &'a [u8],
    pub(super) escaped: bool,
}

impl Str<'_> {
    /// Whether the string is `key` in ASCII, ignoring case (Go's `encoding/json`, which
    /// grpc-go uses, matches keys that way; grpc-go's own examples write `MaxAttempts`).
    pub(super) fn is_key(&self, camel: &str, snake: &str) -> bool {
        !self.escaped
            && (self.raw.eq_ignore_ascii_case(camel.as_bytes())
                || self.raw.eq_ignore_ascii_case(snake.as_bytes()))
    }
}

impl<'a> Reader<'a> {
    pub(super) fn new(text: &'a str, json: &'static ConfigOption) -> Self {
        Reader {
            s: text.as_bytes(),
            pos: 0,
            json,
        }
    }

    fn malformed(&self, reason: &'static str) -> ConfigError {
        ConfigError::Invalid {
            option: self.json,
            reason,
        }
    }

    fn peek(&self) -> Option<u8> {
        self.s.get(self.pos).copied()
    }

    fn ws(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.pos += 1;
        }
    }

    fn eat(&mut self, b: u8) -> bool {
        self.ws();
        if self.peek() == Some(b) {
            self.pos += 1;
            true
        } else {
            false
        }
    }

    /// The end of the text: only whitespace may follow the value.
    pub(super) fn end(&mut self) -> Result<(), ConfigError> {
        self.ws();
        if self.pos == self.s.len() {
            Ok(())
        } else {
            Err(self.malformed("trailing characters after the JSON value"))
        }
    }

    /// `{`, starting an object.
    pub(super) fn begin_object(&mut self) -> Result<(), ConfigError> {
        if self.eat(b'{') {
            Ok(())
        } else {
            Err(self.malformed("expected an object"))
        }
    }

    /// The next member's key and its `:`, or `None` at the object's `}`. `first` is whether
    /// no member has been read yet (no comma before it).
    pub(super) fn next_key(&mut self, first: &mut bool) -> Result<Option<Str<'a>>, ConfigError> {
        // A `}` right after `{` or after a member; after a `,` a key must follow (the
        // string below refuses a `}`), so a trailing comma is malformed.
        if self.eat(b'}') {
            return Ok(None);
        }
        if !*first && !self.eat(b',') {
            return Err(self.malformed("expected `,` or `}` in an object"));
        }
        *first = false;
        self.ws();
        let key = self.string()?;
        if !self.eat(b':') {
            return Err(self.malformed("expected `:` after an object key"));
        }
        Ok(Some(key))
    }

    /// `[`, starting an array.
    pub(super) fn begin_array(&mut self) -> Result<(), ConfigError> {
        if self.eat(b'[') {
            Ok(())
        } else {
            Err(self.malformed("expected an array"))
        }
    }

    /// Whether another element follows (reading its `,`), or `false` at the array's `]`.
    pub(super) fn next_element(&mut self, first: &mut bool) -> Result<bool, ConfigError> {
        if self.eat(b']') {
            return Ok(false);
        }
        if !*first && !self.eat(b',') {
            return Err(self.malformed("expected `,` or `]` in an array"));
        }
        *first = false;
        Ok(true)
    }

    /// The next value if it is a string.
    pub(super) fn string(&mut self) -> Result<Str<'a>, ConfigError> {
        self.ws();
        if self.peek() != Some(b'"') {
            return Err(self.malformed("expected a string"));
        }
        self.pos += 1;
        let start = self.pos;
        let mut escaped = false;
        loop {
            match self.peek() {
                None => return Err(self.malformed("unterminated string")),
                Some(b'"') => break,
                Some(b'\\') => {
                    escaped = true;
                    self.pos += 1;
                    match self.peek() {
                        Some(b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't') => {
                            self.pos += 1
                        }
                        Some(b'u') => {
                            self.pos += 1;
                            for _ in 0..4 {
                                if !self.peek().is_some_and(|b| b.is_ascii_hexdigit()) {
                                    return Err(self.malformed("bad \\u escape in a string"));
                                }
                                self.pos += 1;
                            }
                        }
                        _ => return Err(self.malformed("bad escape in a string")),
                    }
                }
                Some(b) if b < 0x20 => return Err(self.malformed("control character in a string")),
                Some(_) => self.pos += 1,
            }
        }
        let raw = &self.s[start..self.pos];
        self.pos += 1;
        Ok(Str { raw, escaped })
    }

    /// Whether the next value is a string (without reading it).
    pub(super) fn at_string(&mut self) -> bool {
        self.ws();
        self.peek() == Some(b'"')
    }

    /// Whether the next value is `null` (reading it if so).
    pub(super) fn null(&mut self) -> bool {
        self.ws();
        if self.s[self.pos.min(self.s.len())..].starts_with(b"null") {
            self.pos += 4;
            true
        } else {
            false
        }
    }

    /// The next value if it is a number, checked against JSON's grammar, as its text.
    pub(super) fn number(&mut self) -> Result<&'a [u8], ConfigError> {
        self.ws();
        let start = self.pos;
        let json = self.json;
        let bad = || ConfigError::Invalid {
            option: json,
            reason: "expected a number",
        };
        if self.peek() == Some(b'-') {
            self.pos += 1;
        }
        match self.peek() {
            Some(b'0') => self.pos += 1,
            Some(b'1'..=b'9') => self.digits(),
            _ => return Err(bad()),
        }
        if self.peek() == Some(b'.') {
            self.pos += 1;
            if !self.peek().is_some_and(|b| b.is_ascii_digit()) {
                return Err(bad());
            }
            self.digits();
        }
        if matches!(self.peek(), Some(b'e' | b'E')) {
            self.pos += 1;
            if matches!(self.peek(), Some(b'+' | b'-')) {
                self.pos += 1;
            }
            if !self.peek().is_some_and(|b| b.is_ascii_digit()) {
                return Err(bad());
            }
            self.digits();
        }
        Ok(&self.s[start..self.pos])
    }

    fn digits(&mut self) {
        while self.peek().is_some_and(|b| b.is_ascii_digit()) {
            self.pos += 1;
        }
    }

    /// Skips one value of any kind, nested at most [`MAX_DEPTH`] deep.
    pub(super) fn skip(&mut self) -> Result<(), ConfigError> {
        self.skip_at(0)
    }

    fn skip_at(&mut self, depth: u32) -> Result<(), ConfigError> {
        if depth >= MAX_DEPTH {
            return Err(self.malformed("nested too deeply"));
        }
        self.ws();
        match self.peek() {
            Some(b'{') => {
                self.begin_object()?;
                let mut first = true;
                while self.next_key(&mut first)?.is_some() {
                    self.skip_at(depth + 1)?;
                }
                Ok(())
            }
            Some(b'[') => {
                self.begin_array()?;
                let mut first = true;
                while self.next_element(&mut first)? {
                    self.skip_at(depth + 1)?;
                }
                Ok(())
            }
            Some(b'"') => self.string().map(|_| ()),
            Some(b't') => self.literal(b"true"),
            Some(b'f') => self.literal(b"false"),
            Some(b'n') => self.literal(b"null"),
            _ => self.number().map(|_| ()),
        }
    }

    fn literal(&mut self, word: &[u8]) -> Result<(), ConfigError> {
        if self.s[self.pos..].starts_with(word) {
            self.pos += word.len();
            Ok(())
        } else {
            Err(self.malformed("unknown literal"))
        }
    }
}

/// A JSON number's value as decimal digits: `digits` (integer and fraction digits, no
/// point) and the position of the decimal point in them after the exponent is applied, so
/// the value is `0.d₁d₂… × 10^point`. Exact: no float is involved.
#[derive(Debug, Clone, Copy)]
pub(super) struct Decimal<'a> {
    pub(super) negative: bool,
    digits: &'a [u8],
    int_len: usize,
    exp: i64,
    /// Written with neither a point nor an exponent.
    plain: bool,
}

impl<'a> Decimal<'a> {
    /// Parses text that [`Reader::number`] accepted (or the number part of a duration).
    pub(super) fn parse(text: &'a [u8]) -> Option<Decimal<'a>> {
        let (negative, rest) = match text.split_first() {
            Some((b'-', rest)) => (true, rest),
            _ => (false, text),
        };
        let (mantissa, exp, has_exp) = match rest.iter().position(|b| matches!(b, b'e' | b'E')) {
            Some(i) => (&rest[..i], parse_exp(&rest[i + 1..])?, true),
            None => (rest, 0, false),
        };
        let (int, frac, has_point) = match mantissa.iter().position(|b| *b == b'.') {
            Some(i) => (&mantissa[..i], &mantissa[i + 1..], true),
            None => (mantissa, &mantissa[mantissa.len()..], false),
        };
        // A point needs a digit after it; the integer part may be empty (".1s", as gRFC A6
        // writes durations).
        if (int.is_empty() && frac.is_empty()) || (has_point && frac.is_empty()) {
            return None;
        }
        if !int.iter().chain(frac).all(u8::is_ascii_digit) {
            return None;
        }
        // `int` and `frac` are adjacent in `mantissa` except for the point: keep them apart.
        Some(Decimal {
            negative,
            digits: mantissa,
            int_len: int.len(),
            exp,
            plain: !has_point && !has_exp,
        })
    }

    fn digit_iter(&self) -> impl Iterator<Item = u8> + '_ {
        self.digits.iter().copied().filter(u8::is_ascii_digit)
    }

    /// Whether the value is zero.
    pub(super) fn is_zero(&self) -> bool {
        self.digit_iter().all(|d| d == b'0')
    }

    /// Whether the number was written as an integer (no point, no exponent).
    pub(super) fn is_plain_integer(&self) -> bool {
        self.plain
    }

    /// `⌊|value|·10^k⌋`, or `None` if it does not fit in `u64`.
    pub(super) fn floor_scaled(&self, k: i64) -> Option<u64> {
        // Digits before the (shifted) point.
        let point = i64::try_from(self.int_len)
            .ok()?
            .saturating_add(self.exp)
            .saturating_add(k);
        let mut v: u64 = 0;
        let mut i: i64 = 0;
        for d in self.digit_iter() {
            if i >= point {
                return Some(v);
            }
            v = v.checked_mul(10)?.checked_add(u64::from(d - b'0'))?;
            i += 1;
        }
        // Pad with zeros up to the point.
        while i < point {
            if v != 0 {
                v = v.checked_mul(10)?;
            }
            i += 1;
            if i > 40 && v == 0 {
                return Some(0);
            }
        }
        Some(v)
    }

    /// How many digits follow the point once trailing zeros are dropped (the smallest `k`
    /// with `value·10^k` an integer), capped at `limit + 1`.
    pub(super) fn fraction_digits(&self, limit: i64) -> i64 {
        let point = i64::try_from(self.int_len)
            .unwrap_or(i64::MAX)
            .saturating_add(self.exp);
        let mut last_nonzero: Option<i64> = None;
        for (i, d) in self.digit_iter().enumerate() {
            if d != b'0' {
                last_nonzero = Some(i64::try_from(i).unwrap_or(i64::MAX));
            }
        }
        match last_nonzero {
            None => 0,
            Some(i) => (i + 1).saturating_sub(point).clamp(0, limit + 1),
        }
    }
}

/// An exponent's digits (with an optional sign), saturated far beyond any value that fits.
fn parse_exp(text: &[u8]) -> Option<i64> {
    let (neg, digits) = match text.split_first() {
        Some((b'-', rest)) => (true, rest),
        Some((b'+', rest)) => (false, rest),
        _ => (false, text),
    };
    if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let mut e: i64 = 0;
    for d in digits {
        e = (e * 10 + i64::from(d - b'0')).min(1_000_000);
    }
    Some(if neg { -e } else { e })
}
