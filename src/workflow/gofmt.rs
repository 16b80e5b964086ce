//! The anchor's text forms of a value: an expression's result is written with Go's `%v`
//! (lists as JSON), and `json.Marshal` writes Go's JSON (HTML-safe escapes, sorted map keys).

use expr::Value;

/// Go's `%v` of a value as the anchor writes an expression's result: lists as JSON.
pub fn result_text(v: &Value) -> String {
    match v {
        Value::Array(_) => json(v),
        other => percent_v(other),
    }
}

/// Go's `%v` (`fmt.Sprintf("%v", x)`) for the values an expression can give.
pub fn percent_v(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Bool(b) => b.to_string(),
        Value::Integer(i) => i.to_string(),
        Value::Float(f) => go_float(*f),
        Value::Nil => "<nil>".to_string(),
        Value::Array(items) => {
            let inner: Vec<String> = items.iter().map(percent_v).collect();
            format!("[{}]", inner.join(" "))
        }
        Value::Map(m) => {
            let mut keys: Vec<&String> = m.keys().collect();
            keys.sort();
            let inner: Vec<String> = keys
                .into_iter()
                .map(|k| format!("{k}:{}", percent_v(&m[k])))
                .collect();
            format!("map[{}]", inner.join(" "))
        }
        Value::KeyedMap(pairs) => {
            let inner: Vec<String> = pairs
                .iter()
                .map(|(k, v)| format!("{}:{}", percent_v(k), percent_v(v)))
                .collect();
            format!("map[{}]", inner.join(" "))
        }
        Value::Bytes(b) => format!("{b:?}"),
    }
}

/// `strconv.FormatFloat(f, 'g', -1, 64)`: the shortest text that reads back as `f`, with an
/// exponent when it is below -4 or at least 6 (what `%v` prints: `1e+06`).
pub fn go_float(f: f64) -> String {
    if f.is_nan() {
        return "NaN".to_string();
    }
    if f.is_infinite() {
        return if f > 0.0 { "+Inf" } else { "-Inf" }.to_string();
    }
    if f == 0.0 {
        return if f.is_sign_negative() { "-0" } else { "0" }.to_string();
    }
    // Rust's `{:e}` is the shortest round-trip form: digits and exponent.
    let e = format!("{f:e}");
    let (mantissa, exp) = e.split_once('e').unwrap_or((&e, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let neg = mantissa.starts_with('-');
    let digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();
    // %v uses %g with the shortest precision; the exponent form when exp < -4 || exp >= 6.
    let body = if !(-4..6).contains(&exp) {
        let mut m = digits[..1].to_string();
        if digits.len() > 1 {
            m.push('.');
            m.push_str(&digits[1..]);
        }
        let sign = if exp < 0 { '-' } else { '+' };
        format!("{m}e{sign}{:02}", exp.abs())
    } else if exp < 0 {
        format!("0.{}{}", "0".repeat((-exp - 1) as usize), digits)
    } else {
        let point = exp as usize + 1;
        if digits.len() <= point {
            format!("{digits}{}", "0".repeat(point - digits.len()))
        } else {
            format!("{}.{}", &digits[..point], &digits[point..])
        }
    };
    if neg { format!("-{body}") } else { body }
}

/// Go's `json.Marshal` of a value: maps with sorted keys, `<`, `>`, `&` escaped as `\u003c`...
pub fn json(v: &Value) -> String {
    let mut out = String::new();
    write_json(v, &mut out);
    out
}

fn write_json(v: &Value, out: &mut String) {
    match v {
        Value::Nil => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Integer(i) => out.push_str(&i.to_string()),
        Value::Float(f) => out.push_str(&json_float(*f)),
        Value::String(s) => write_json_string(s, out),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_json(item, out);
            }
            out.push(']');
        }
        Value::Map(m) => write_json_object(m.iter().map(|(k, v)| (k.clone(), v)), out),
        Value::KeyedMap(pairs) => {
            write_json_object(pairs.iter().map(|(k, v)| (percent_v(k), v)), out)
        }
        Value::Bytes(b) => {
            let text: String = b.iter().map(|x| format!("{x:02x}")).collect();
            write_json_string(&text, out);
        }
    }
}

/// A JSON object with its keys sorted, as Go's encoder writes a map.
fn write_json_object<'v>(entries: impl Iterator<Item = (String, &'v Value)>, out: &mut String) {
    let mut items: Vec<(String, &Value)> = entries.collect();
    items.sort_by(|a, b| a.0.cmp(&b.0));
    out.push('{');
    for (i, (k, v)) in items.into_iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        write_json_string(&k, out);
        out.push(':');
        write_json(v, out);
    }
    out.push('}');
}

/// Go's JSON number for a float64: `%g`-like, integers without a fraction.
fn json_float(f: f64) -> String {
    if !f.is_finite() {
        return "null".to_string();
    }
    let abs = f.abs();
    if abs != 0.0 && !(1e-6..1e21).contains(&abs) {
        let e = format!("{f:e}");
        let (m, exp) = e.split_once('e').unwrap_or((&e, "0"));
        let exp: i32 = exp.parse().unwrap_or(0);
        let sign = if exp < 0 { '-' } else { '+' };
        return format!("{m}e{sign}{:02}", exp.abs());
    }
    let s = format!("{f}");
    s.strip_suffix(".0").map(str::to_string).unwrap_or(s)
}

fn write_json_string(s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '<' => out.push_str("\\u003c"),
            '>' => out.push_str("\\u003e"),
            '&' => out.push_str("\\u0026"),
            '\u{2028}' => out.push_str("\\u2028"),
            '\u{2029}' => out.push_str("\\u2029"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
}

/// A JSON document as the anchor's `json.Unmarshal` gives it: numbers as float64.
pub fn from_json(v: &serde_json::Value) -> Value {
    match v {
        serde_json::Value::Null => Value::Nil,
        serde_json::Value::Bool(b) => Value::Bool(*b),
        serde_json::Value::Number(n) => Value::Float(n.as_f64().unwrap_or(0.0)),
        serde_json::Value::String(s) => Value::String(s.clone()),
        serde_json::Value::Array(a) => Value::Array(a.iter().map(from_json).collect()),
        serde_json::Value::Object(m) => {
            Value::Map(m.iter().map(|(k, v)| (k.clone(), from_json(v))).collect())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats_as_go_prints_them() {
        for (f, want) in [
            (1.0, "1"),
            (0.5, "0.5"),
            (1e6, "1e+06"),
            (123456.0, "123456"),
            (1e20, "1e+20"),
            (1234567.5, "1.2345675e+06"),
            (0.0001, "0.0001"),
            (0.00001, "1e-05"),
            (-2.5, "-2.5"),
        ] {
            assert_eq!(go_float(f), want, "{f}");
        }
    }

    #[test]
    fn values_as_go_writes_them() {
        let list = Value::Array(vec![Value::String("a<b".into()), Value::Float(2.0)]);
        assert_eq!(result_text(&list), r#"["a\u003cb",2]"#);
        assert_eq!(percent_v(&list), "[a<b 2]");
        assert_eq!(result_text(&Value::Nil), "<nil>");
        assert_eq!(result_text(&Value::Bool(true)), "true");
        let m = from_json(&serde_json::json!({"b": 1, "a": [true]}));
        assert_eq!(percent_v(&m), "map[a:[true] b:1]");
        assert_eq!(json(&m), r#"{"a":[true],"b":1}"#);
    }
}
