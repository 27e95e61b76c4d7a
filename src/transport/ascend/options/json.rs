//! The strict JSON reader of the option values: `serde_json` (RFC 8259) with duplicate keys
//! refused and nesting at most 64 levels deep.

/// A parsed JSON value, object members in order. Integers keep their decimal text; other
/// numbers are written with a fraction or exponent (`1.5`, `1000.0`, `1e21`), so they are never
/// taken for integers.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Json {
    /// `null`.
    Null,
    /// `true` / `false`.
    Bool(bool),
    /// A number, as text.
    Num(String),
    /// A string.
    Str(String),
    /// An array.
    Arr(Vec<Json>),
    /// An object, in order.
    Obj(Vec<(String, Json)>),
}

impl Json {
    /// The members, if this is an object.
    pub(super) fn as_object(&self) -> Option<&[(String, Json)]> {
        match self {
            Json::Obj(o) => Some(o),
            _ => None,
        }
    }
    /// The elements, if this is an array.
    pub(super) fn as_array(&self) -> Option<&[Json]> {
        match self {
            Json::Arr(a) => Some(a),
            _ => None,
        }
    }
}

/// The value of `key` in an object's members (the first, though duplicates are refused).
pub(super) fn get<'a>(obj: &'a [(String, Json)], key: &str) -> Option<&'a Json> {
    obj.iter().find(|(k, _)| k == key).map(|(_, v)| v)
}

const MALFORMED: &str = "well-formed JSON";
const TOO_DEEP: &str = "JSON nested at most 64 levels deep";
const DUPLICATE: &str = "JSON without duplicate keys";
const MAX_DEPTH: usize = 64;

/// Parses a complete JSON text with `serde_json` (RFC 8259: no comments, no trailing commas,
/// no lone surrogates, nothing after the value).
///
/// # Errors
/// A short description for malformed input, duplicate keys or nesting beyond 64 levels.
pub(crate) fn parse_json(text: &str) -> Result<Json, &'static str> {
    use serde::de::DeserializeSeed;
    let mut de = serde_json::Deserializer::from_str(text);
    let v = Seed { depth: 0 }.deserialize(&mut de).map_err(|e| {
        let e = e.to_string();
        if e.starts_with(TOO_DEEP) {
            TOO_DEEP
        } else if e.starts_with(DUPLICATE) {
            DUPLICATE
        } else {
            MALFORMED
        }
    })?;
    de.end().map_err(|_| MALFORMED)?;
    Ok(v)
}

/// Builds a [`Json`] at nesting depth `depth`.
struct Seed {
    depth: usize,
}

impl<'de> serde::de::DeserializeSeed<'de> for Seed {
    type Value = Json;
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Json, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> serde::de::Visitor<'de> for Seed {
    type Value = Json;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_bool<E>(self, b: bool) -> Result<Json, E> {
        Ok(Json::Bool(b))
    }
    fn visit_u64<E>(self, n: u64) -> Result<Json, E> {
        Ok(Json::Num(n.to_string()))
    }
    fn visit_i64<E>(self, n: i64) -> Result<Json, E> {
        Ok(Json::Num(n.to_string()))
    }
    fn visit_f64<E>(self, n: f64) -> Result<Json, E> {
        Ok(Json::Num(format!("{n:?}")))
    }
    fn visit_str<E>(self, s: &str) -> Result<Json, E> {
        Ok(Json::Str(s.to_owned()))
    }
    fn visit_string<E>(self, s: String) -> Result<Json, E> {
        Ok(Json::Str(s))
    }
    fn visit_unit<E>(self) -> Result<Json, E> {
        Ok(Json::Null)
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut a: A) -> Result<Json, A::Error> {
        if self.depth >= MAX_DEPTH {
            return Err(serde::de::Error::custom(TOO_DEEP));
        }
        let mut v = Vec::new();
        while let Some(x) = a.next_element_seed(Seed {
            depth: self.depth + 1,
        })? {
            v.push(x);
        }
        Ok(Json::Arr(v))
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut a: A) -> Result<Json, A::Error> {
        if self.depth >= MAX_DEPTH {
            return Err(serde::de::Error::custom(TOO_DEEP));
        }
        let mut o: Vec<(String, Json)> = Vec::new();
        while let Some(k) = a.next_key::<String>()? {
            if o.iter().any(|(seen, _)| *seen == k) {
                return Err(serde::de::Error::custom(DUPLICATE));
            }
            let v = a.next_value_seed(Seed {
                depth: self.depth + 1,
            })?;
            o.push((k, v));
        }
        Ok(Json::Obj(o))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_parser_is_strict() {
        assert_eq!(
            parse_json(r#" {"a":[1,-2.5e3,true,false,null,"x\u00e9\ud83d\ude00\n"]} "#).unwrap(),
            Json::Obj(vec![(
                "a".into(),
                Json::Arr(vec![
                    Json::Num("1".into()),
                    Json::Num("-2500.0".into()),
                    Json::Bool(true),
                    Json::Bool(false),
                    Json::Null,
                    Json::Str("xé😀\n".into()),
                ])
            )])
        );
        for bad in [
            "",
            "{\"a\":1,\"a\":2}",
            "{\"a\":{\"b\":1,\"b\":1}}",
            "{",
            "}",
            "[1,]",
            "{\"a\":1,}",
            "01",
            "1.",
            ".5",
            "-",
            "1e",
            "+1",
            "'a'",
            "\"\\x\"",
            "\"\t\"",
            "\"\\ud800\"",
            "{\"a\" 1}",
            "[1 2]",
            "nul",
            "truex",
            "{} {}",
            "/* c */ {}",
        ] {
            assert!(parse_json(bad).is_err(), "{bad:?} accepted");
        }
        let deep = format!("{}{}", "[".repeat(65), "]".repeat(65));
        assert!(parse_json(&deep).is_err());
        let ok_deep = format!("{}{}", "[".repeat(64), "]".repeat(64));
        assert!(parse_json(&ok_deep).is_ok());
    }
}
