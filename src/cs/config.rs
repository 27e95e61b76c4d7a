//! `global_resource_config` (a JSON object with flat dotted keys, as upstream reads it) and the
//! client's RDMA environment: checked as upstream checks them, so a program that upstream
//! refuses is refused here too. hixl carries HIXL-CS on its own engine, without hcomm channels
//! or a per-device transfer pool, so the values, once valid, change nothing.

/// A JSON value, as far as the config needs it.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Value {
    Num(f64),
    Str(String),
    Bool(bool),
    Null,
    /// An array or an object (not a value any key takes).
    Nested,
}

/// Parses a JSON object into its top-level `(key, value)` pairs; `Err` for anything that is not
/// one JSON object (nesting at most 64 deep).
pub(super) fn parse_object(text: &str) -> Result<Vec<(String, Value)>, String> {
    let mut p = Parser {
        b: text.as_bytes(),
        i: 0,
    };
    p.ws();
    if p.peek() != Some(b'{') {
        return Err("global_resource_config is not a JSON object".into());
    }
    let pairs = p
        .object(0)?
        .ok_or("global_resource_config is not a JSON object")?;
    p.ws();
    if p.i != p.b.len() {
        return Err("trailing characters after the JSON object".into());
    }
    Ok(pairs)
}

struct Parser<'a> {
    b: &'a [u8],
    i: usize,
}

impl Parser<'_> {
    fn peek(&self) -> Option<u8> {
        self.b.get(self.i).copied()
    }
    fn ws(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.i += 1;
        }
    }
    fn eat(&mut self, c: u8) -> Result<(), String> {
        self.ws();
        if self.peek() == Some(c) {
            self.i += 1;
            Ok(())
        } else {
            Err(format!(
                "bad JSON at byte {}: expected '{}'",
                self.i, c as char
            ))
        }
    }
    /// An object's pairs when `depth` is 0 (the top level), else `None` once skipped.
    fn object(&mut self, depth: u32) -> Result<Option<Vec<(String, Value)>>, String> {
        self.eat(b'{')?;
        let mut out = Vec::new();
        self.ws();
        if self.peek() == Some(b'}') {
            self.i += 1;
            return Ok(Some(out));
        }
        loop {
            self.ws();
            let k = self.string()?;
            self.eat(b':')?;
            let v = self.value(depth + 1)?;
            out.push((k, v));
            self.ws();
            match self.peek() {
                Some(b',') => self.i += 1,
                Some(b'}') => {
                    self.i += 1;
                    return Ok(Some(out));
                }
                _ => return Err(format!("bad JSON at byte {}", self.i)),
            }
        }
    }
    fn array(&mut self, depth: u32) -> Result<(), String> {
        self.eat(b'[')?;
        self.ws();
        if self.peek() == Some(b']') {
            self.i += 1;
            return Ok(());
        }
        loop {
            self.value(depth + 1)?;
            self.ws();
            match self.peek() {
                Some(b',') => self.i += 1,
                Some(b']') => {
                    self.i += 1;
                    return Ok(());
                }
                _ => return Err(format!("bad JSON at byte {}", self.i)),
            }
        }
    }
    fn value(&mut self, depth: u32) -> Result<Value, String> {
        if depth > 64 {
            return Err("JSON nested too deep".into());
        }
        self.ws();
        match self.peek() {
            Some(b'{') => self.object(depth).map(|_| Value::Nested),
            Some(b'[') => self.array(depth).map(|()| Value::Nested),
            Some(b'"') => self.string().map(Value::Str),
            Some(b't') => self.word("true", Value::Bool(true)),
            Some(b'f') => self.word("false", Value::Bool(false)),
            Some(b'n') => self.word("null", Value::Null),
            Some(b'-' | b'0'..=b'9') => self.number(),
            _ => Err(format!("bad JSON value at byte {}", self.i)),
        }
    }
    fn word(&mut self, w: &str, v: Value) -> Result<Value, String> {
        if self.b[self.i..].starts_with(w.as_bytes()) {
            self.i += w.len();
            Ok(v)
        } else {
            Err(format!("bad JSON literal at byte {}", self.i))
        }
    }
    fn number(&mut self) -> Result<Value, String> {
        let start = self.i;
        while matches!(
            self.peek(),
            Some(b'-' | b'+' | b'.' | b'e' | b'E' | b'0'..=b'9')
        ) {
            self.i += 1;
        }
        std::str::from_utf8(&self.b[start..self.i])
            .ok()
            .and_then(|s| s.parse::<f64>().ok())
            .map(Value::Num)
            .ok_or_else(|| format!("bad JSON number at byte {start}"))
    }
    fn string(&mut self) -> Result<String, String> {
        self.eat(b'"')?;
        let mut out = Vec::new();
        loop {
            let Some(c) = self.peek() else {
                return Err("unterminated JSON string".into());
            };
            self.i += 1;
            match c {
                b'"' => break,
                b'\\' => {
                    let Some(e) = self.peek() else {
                        return Err("unterminated JSON string".into());
                    };
                    self.i += 1;
                    match e {
                        b'"' | b'\\' | b'/' => out.push(e),
                        b'b' => out.push(8),
                        b'f' => out.push(12),
                        b'n' => out.push(b'\n'),
                        b'r' => out.push(b'\r'),
                        b't' => out.push(b'\t'),
                        b'u' => {
                            let hex = self
                                .b
                                .get(self.i..self.i + 4)
                                .and_then(|h| std::str::from_utf8(h).ok())
                                .and_then(|h| u32::from_str_radix(h, 16).ok())
                                .ok_or("bad \\u escape in a JSON string")?;
                            self.i += 4;
                            let ch = char::from_u32(hex).unwrap_or('\u{fffd}');
                            let mut buf = [0u8; 4];
                            out.extend_from_slice(ch.encode_utf8(&mut buf).as_bytes());
                        }
                        _ => return Err("bad escape in a JSON string".into()),
                    }
                }
                c if c < 0x20 => return Err("a control character in a JSON string".into()),
                c => out.push(c),
            }
        }
        String::from_utf8(out).map_err(|_| "a JSON string that is not UTF-8".into())
    }
}

/// Which side reads the config (the keys each side takes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Side {
    Server,
    Client,
}

/// An integer key's value in `lo..=hi`.
fn int(key: &str, v: &Value, lo: u64, hi: u64) -> Result<u64, String> {
    match v {
        Value::Num(n) if n.fract() == 0.0 && *n >= lo as f64 && *n <= hi as f64 => Ok(*n as u64),
        _ => Err(format!(
            "{key} must be an integer in {lo}..={hi}, not {v:?}"
        )),
    }
}

/// Checks `global_resource_config` (null or "" is none): a JSON object whose
/// `comm_resource_config.listen_port` (server: 1..65535), `comm_resource_config.qos` (client:
/// 0..7) and `comm_resource_config.max_active_channels` (both: at least 1) are in range. Keys
/// starting with `hixl.` (a hixl extension; upstream reads no such key) are options of the
/// engine under the server or client (`"hixl.SameHost": "off"`, ...), returned as strings and
/// checked by the engine's option parser; other keys are not read.
pub(super) fn check(text: Option<&str>, side: Side) -> Result<Vec<(String, String)>, String> {
    let mut engine = Vec::new();
    let Some(text) = text.filter(|t| !t.is_empty()) else {
        return Ok(engine);
    };
    for (k, v) in parse_object(text)? {
        if k.starts_with("hixl.") {
            let v = match v {
                Value::Str(s) => s,
                Value::Num(n) if n.fract() == 0.0 && n.abs() < 1e15 => format!("{}", n as i64),
                Value::Bool(b) => if b { "1" } else { "0" }.to_owned(),
                _ => return Err(format!("{k} must be a string, an integer or a boolean")),
            };
            crate::Options::from_pairs([(k.as_str(), v.as_str())])
                .map_err(|e| format!("{k}: {e}"))?;
            engine.push((k, v));
            continue;
        }
        match (k.as_str(), side) {
            ("comm_resource_config.listen_port", Side::Server) => {
                int(&k, &v, 1, 65535)?;
            }
            ("comm_resource_config.qos", Side::Client) => {
                int(&k, &v, 0, 7)?;
            }
            ("comm_resource_config.max_active_channels", _) => {
                int(&k, &v, 1, u32::MAX as u64)?;
            }
            _ => {}
        }
    }
    Ok(engine)
}

/// The client's RDMA environment as upstream reads it: `HCCL_RDMA_RETRY_CNT` (1..=7) and
/// `HCCL_RDMA_TIMEOUT` (5..=20), when set.
pub(super) fn check_env() -> Result<(), String> {
    check_env_of(|name| std::env::var_os(name))
}

/// [`check_env`] over the environment `var` reads.
fn check_env_of(var: impl Fn(&str) -> Option<std::ffi::OsString>) -> Result<(), String> {
    for (name, lo, hi) in [("HCCL_RDMA_RETRY_CNT", 1, 7), ("HCCL_RDMA_TIMEOUT", 5, 20)] {
        if let Some(v) = var(name) {
            let ok = v
                .to_str()
                .and_then(|s| s.trim().parse::<u32>().ok())
                .is_some_and(|n| (lo..=hi).contains(&n));
            if !ok {
                return Err(format!("{name}={v:?} is not an integer in {lo}..={hi}"));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn configs() {
        assert!(check(None, Side::Server).is_ok());
        assert!(check(Some(""), Side::Client).is_ok());
        let ok = r#" {"comm_resource_config.listen_port": 26000, "x": [1, {"y": "\u00e9"}],
                      "comm_resource_config.max_active_channels": 4} "#;
        assert!(check(Some(ok), Side::Server).is_ok());
        for bad in [
            "[]",
            "{",
            "{\"a\":1,}",
            "{\"a\":1} x",
            "nope",
            "{\"comm_resource_config.max_active_channels\":0}",
            "{\"comm_resource_config.max_active_channels\":1.5}",
        ] {
            assert!(check(Some(bad), Side::Server).is_err(), "{bad}");
        }
        assert!(check(Some("{\"comm_resource_config.qos\":8}"), Side::Client).is_err());
        assert!(check(Some("{\"comm_resource_config.qos\":8}"), Side::Server).is_ok());
        assert_eq!(
            check(Some("{\"hixl.SameHost\": \"off\"}"), Side::Client).unwrap(),
            vec![("hixl.SameHost".to_owned(), "off".to_owned())]
        );
        assert!(check(Some("{\"hixl.NoSuchKey\": 1}"), Side::Client).is_err());
        assert!(check(Some("{\"hixl.SameHost\": [1]}"), Side::Client).is_err());
        assert!(
            check(
                Some("{\"comm_resource_config.listen_port\":0}"),
                Side::Server
            )
            .is_err()
        );
        let deep = "[".repeat(100) + &"]".repeat(100);
        assert!(check(Some(&format!("{{\"a\":{deep}}}")), Side::Server).is_err());
    }

    #[test]
    fn the_rdma_environment_is_checked_as_upstream() {
        let env = |pairs: Vec<(&'static str, &'static str)>| {
            move |name: &str| {
                (pairs.iter())
                    .find(|(k, _)| *k == name)
                    .map(|(_, v)| std::ffi::OsString::from(v))
            }
        };
        assert!(check_env_of(env(vec![])).is_ok());
        let good = vec![("HCCL_RDMA_RETRY_CNT", "7"), ("HCCL_RDMA_TIMEOUT", " 5 ")];
        assert!(check_env_of(env(good)).is_ok());
        for bad in [
            ("HCCL_RDMA_RETRY_CNT", "9"),
            ("HCCL_RDMA_RETRY_CNT", "0"),
            ("HCCL_RDMA_TIMEOUT", "21"),
            ("HCCL_RDMA_TIMEOUT", "x"),
        ] {
            assert!(check_env_of(env(vec![bad])).is_err(), "{bad:?}");
        }
    }
}
