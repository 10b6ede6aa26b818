//! Domain age: when a domain was registered (RDAP's `registration` event) and the young-domain
//! rule that weighs it into a verdict.
//!
//! Age is a modifier, never a verdict by itself: new companies register domains every day and
//! sign up to services in their first week. A young domain (fewer than `rdap.young_days`) that
//! nothing else flagged has its score raised within the low band (`scores.young_domain`, or
//! `scores.young_domain_weak_mx` when its mail does not go first to a business provider) and
//! stays `safe`. An established one (more than `rdap.established_days`) is not flipped to
//! `disposable` by its MX neighbours alone (`scores.neighbourhood_established`): planted
//! neighbours cannot make a years-old company a throwaway. It applies only to names the table
//! leaves unknown. The rule itself is [`super::classify::apply_age`], beside the other rules.

use serde::Serialize;

/// Days from 1970-01-01 (a proleptic Gregorian day number, negative before 1970).
pub type DayNumber = i32;

/// What RDAP said of a domain's age, as of the lookup's day.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DomainAge {
    /// The day of the `registration` event.
    pub registered: DayNumber,
    /// Whole days from `registered` to the lookup's day (0 on the day itself).
    pub age_days: u32,
}

impl DomainAge {
    /// The age on `today` of a domain registered on `registered` (a date in the future, from a
    /// registry's clock running ahead, counts as registered today).
    pub fn on(registered: DayNumber, today: DayNumber) -> Self {
        DomainAge {
            registered,
            age_days: u32::try_from(today - registered).unwrap_or(0),
        }
    }

    /// `registered` as `YYYY-MM-DD`.
    pub fn registered_date(&self) -> String {
        let (y, m, d) = civil_from_days(self.registered);
        format!("{y:04}-{m:02}-{d:02}")
    }
}

/// What the young-domain rule did to a verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum YoungEffect {
    /// Registered fewer than `young_days` ago: the score was raised, the reason left `safe`.
    Raised,
}

/// How age weighs (`gateway.rdap`): below `young_days` a domain is young, from
/// `established_days` on it is established; 0 turns either off.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AgeRule {
    pub young_days: u32,
    pub established_days: u32,
}

impl AgeRule {
    /// Age changes nothing (RDAP off): the age is still shown when known.
    pub const OFF: AgeRule = AgeRule {
        young_days: 0,
        established_days: 0,
    };

    pub fn is_young(&self, age: DomainAge) -> bool {
        age.age_days < self.young_days
    }

    pub fn is_established(&self, age: DomainAge) -> bool {
        self.established_days > 0 && age.age_days >= self.established_days
    }
}

/// The day number of a civil date (Howard Hinnant's `days_from_civil`).
pub fn days_from_civil(y: i32, m: u32, d: u32) -> DayNumber {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let m = m as i32;
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + d as i32 - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The civil date of a day number (the inverse of [`days_from_civil`]).
pub fn civil_from_days(z: DayNumber) -> (i32, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i32::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn day_numbers_round_trip_and_match_known_dates() {
        assert_eq!(days_from_civil(1970, 1, 1), 0);
        assert_eq!(days_from_civil(2000, 3, 1), 11_017);
        assert_eq!(civil_from_days(20_416), (2025, 11, 24));
        assert_eq!(
            DomainAge::on(days_from_civil(2026, 11, 20), days_from_civil(2026, 11, 24))
                .registered_date(),
            "2026-11-20"
        );
    }

    proptest! {
        #[test]
        fn civil_dates_round_trip(z in -800_000i32..800_000) {
            let (y, m, d) = civil_from_days(z);
            prop_assert_eq!(days_from_civil(y, m, d), z);
        }
    }
}
