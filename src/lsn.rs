//! PostgreSQL write-ahead log positions.

use std::fmt;
use std::str::FromStr;

/// A write-ahead log position (`pg_lsn`): a byte offset into the WAL.
///
/// Printed and parsed in PostgreSQL's `XXXXXXXX/XXXXXXXX` form (hex high and low 32 bits).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Lsn(pub u64);

impl Lsn {
    /// `0/0`, PostgreSQL's `InvalidXLogRecPtr`.
    pub const ZERO: Lsn = Lsn(0);

    /// The LSN as a log field, or no field for [`Lsn::ZERO`] (a polled row has no LSN).
    pub fn known(self) -> Option<tracing::field::DisplayValue<Lsn>> {
        (self != Lsn::ZERO).then(|| tracing::field::display(self))
    }
}

impl From<u64> for Lsn {
    fn from(value: u64) -> Self {
        Lsn(value)
    }
}

impl fmt::Display for Lsn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:X}/{:X}", self.0 >> 32, self.0 & 0xffff_ffff)
    }
}

/// The text is not a `pg_lsn` (`XXXXXXXX/XXXXXXXX`).
#[derive(Debug, thiserror::Error)]
#[error("invalid LSN {0:?}: expected two hex numbers separated by '/'")]
pub struct ParseLsnError(String);

impl FromStr for Lsn {
    type Err = ParseLsnError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = || ParseLsnError(s.to_owned());
        let (hi, lo) = s.split_once('/').ok_or_else(err)?;
        let hi = u32::from_str_radix(hi, 16).map_err(|_| err())?;
        let lo = u32::from_str_radix(lo, 16).map_err(|_| err())?;
        Ok(Lsn((u64::from(hi) << 32) | u64::from(lo)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_postgres_text() {
        let lsn: Lsn = "0/113E1080".parse().unwrap();
        assert_eq!(lsn, Lsn(0x113E_1080));
        assert_eq!(lsn.to_string(), "0/113E1080");
        assert_eq!("1A/B".parse::<Lsn>().unwrap(), Lsn((0x1A << 32) | 0xB));
        assert_eq!(Lsn((0x1A << 32) | 0xB).to_string(), "1A/B");
    }

    #[test]
    fn names_a_known_lsn_only() {
        assert!(Lsn::ZERO.known().is_none());
        let shown = Lsn((0x1A << 32) | 0xB).known().map(|v| format!("{v:?}"));
        assert_eq!(shown.as_deref(), Some("1A/B"));
    }

    #[test]
    fn rejects_malformed_text() {
        for bad in ["", "0", "0/", "/0", "g/0", "0/1/2", "100000000/0"] {
            assert!(bad.parse::<Lsn>().is_err(), "{bad:?} parsed");
        }
    }
}
