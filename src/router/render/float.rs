//! Floating-point values as Java's `Double.toString` and `Float.toString` print them (JDK 19
//! and later): what Kafka Connect's `SimpleHeaderConverter` writes for a `FLOAT64` or
//! `FLOAT32` header, and Jackson (in `JsonConverter`) for such a JSON number.
//!
//! The digits are the shortest that read back as the same value (Rust's `{:e}` gives those);
//! where that is one digit, Java takes the closest two-digit decimal that still reads back
//! (`4.9E-324`, not `5E-324`). From 10^-3 up to 10^7 the form is plain (`100.0`, `0.001`),
//! outside it `d.dddE±n` (`1.0E20`, `1.0E-4`); there is always a digit after the point.

/// `text` (a float4 or float8 as PostgreSQL prints it) as Java prints the value: `None` if it
/// is not a number Rust reads.
pub(super) fn java_float(text: &str, double: bool) -> Option<String> {
    Some(if double {
        java_string(text.parse::<f64>().ok()?)
    } else {
        java_string(text.parse::<f32>().ok()?)
    })
}

/// `x` as Java's `Double.toString` prints it.
pub(super) fn java_double(x: f64) -> String {
    java_string(x)
}

/// The float types, for [`java_string`].
trait Float: Copy + PartialEq + std::fmt::LowerExp + std::str::FromStr {
    fn is_nan(self) -> bool;
    fn is_infinite(self) -> bool;
    fn is_zero(self) -> bool;
    fn is_negative(self) -> bool;
    fn abs(self) -> Self;
}

macro_rules! float {
    ($t:ty) => {
        impl Float for $t {
            fn is_nan(self) -> bool {
                <$t>::is_nan(self)
            }
            fn is_infinite(self) -> bool {
                <$t>::is_infinite(self)
            }
            fn is_zero(self) -> bool {
                self == 0.0
            }
            fn is_negative(self) -> bool {
                self.is_sign_negative()
            }
            fn abs(self) -> Self {
                <$t>::abs(self)
            }
        }
    };
}
float!(f32);
float!(f64);

fn java_string<F: Float>(x: F) -> String {
    if x.is_nan() {
        return "NaN".into();
    }
    let sign = if x.is_negative() { "-" } else { "" };
    if x.is_infinite() {
        return format!("{sign}Infinity");
    }
    if x.is_zero() {
        return format!("{sign}0.0");
    }
    let magnitude = x.abs();
    let (mut digits, mut exponent) = scientific(&format!("{magnitude:e}"));
    if digits.len() == 1 {
        // The closest two-digit decimal, if it reads back as the value.
        let two = format!("{magnitude:.1e}");
        if two.parse::<F>().ok() == Some(magnitude) {
            (digits, exponent) = scientific(&two);
        }
    }
    format!("{sign}{}", layout(&digits, exponent))
}

/// The significant digits (no trailing zeros, at least one) and the decimal exponent of the
/// first one, from Rust's `{:e}` form (`1.2345e6`, `5e-324`).
fn scientific(text: &str) -> (String, i32) {
    let (mantissa, exponent) = text.split_once('e').unwrap_or((text, "0"));
    let mut digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();
    while digits.len() > 1 && digits.ends_with('0') {
        digits.pop();
    }
    (digits, exponent.parse().unwrap_or(0))
}

/// Java's layout of `0.d1d2... x 10^(exponent + 1)`.
fn layout(digits: &str, exponent: i32) -> String {
    let fraction = |rest: &str| {
        if rest.is_empty() {
            "0".to_owned()
        } else {
            rest.to_owned()
        }
    };
    match usize::try_from(exponent) {
        // 10^0 up to 10^7: the integer part, a point, at least one more digit.
        Ok(e) if e < 7 => {
            let mut integer = digits.get(..=e).unwrap_or(digits).to_owned();
            while integer.len() <= e {
                integer.push('0');
            }
            format!("{integer}.{}", fraction(digits.get(e + 1..).unwrap_or("")))
        }
        // 10^-3 up to 10^0.
        Err(_) if exponent >= -3 => {
            let zeros = "0".repeat(usize::try_from(-exponent - 1).unwrap_or(0));
            format!("0.{zeros}{digits}")
        }
        _ => format!(
            "{}.{}E{exponent}",
            digits.get(..1).unwrap_or("0"),
            fraction(digits.get(1..).unwrap_or(""))
        ),
    }
}
