//! Configuration of tracing (`gateway.tracing`): OpenTelemetry spans exported by OTLP over
//! HTTP/protobuf. Off unless an endpoint is given here or in the standard `OTEL_*` variables.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_with::{serde_as, DurationMilliSeconds};

/// Where spans go and how many.
#[serde_as]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TracingConfig {
    /// The collector's base URL, as `OTEL_EXPORTER_OTLP_ENDPOINT` is read: spans go to
    /// `<otlp_endpoint>/v1/traces`. Unset (and no `OTEL_EXPORTER_OTLP_*ENDPOINT` in the
    /// environment): tracing is off.
    pub otlp_endpoint: Option<String>,
    /// Share of new traces recorded (0.0 to 1.0); a trusted caller's sampled flag is followed.
    pub sample_ratio: f64,
    /// `service.name` of the spans.
    pub service_name: String,
    /// Extra headers of every export request (e.g. a collector's API key).
    pub headers: BTreeMap<String, String>,
    /// Finished spans waiting for export at most; beyond, new ones are dropped and counted.
    pub queue_size: usize,
    /// One export request's budget, connection included, in milliseconds.
    #[serde(rename = "export_timeout_ms")]
    #[serde_as(as = "DurationMilliSeconds<u64>")]
    pub export_timeout: Duration,
}

impl Default for TracingConfig {
    fn default() -> Self {
        TracingConfig {
            otlp_endpoint: None,
            sample_ratio: 1.0,
            service_name: "domain-risk-gateway".to_owned(),
            headers: BTreeMap::new(),
            queue_size: 2048,
            export_timeout: Duration::from_millis(5_000),
        }
    }
}

// `sample_ratio` is a float; a NaN is refused by `problems`, so equality is an equivalence.
impl Eq for TracingConfig {}

/// Whether `name` is set to something in the environment.
pub fn env_set(name: &str) -> bool {
    std::env::var_os(name).is_some_and(|v| !v.is_empty())
}

impl TracingConfig {
    /// Whether spans are made: an endpoint here or in the environment, and the SDK not
    /// switched off by `OTEL_SDK_DISABLED=true`.
    pub fn is_on(&self) -> bool {
        let disabled =
            std::env::var("OTEL_SDK_DISABLED").is_ok_and(|v| v.trim().eq_ignore_ascii_case("true"));
        !disabled
            && (self.otlp_endpoint.is_some()
                || env_set("OTEL_EXPORTER_OTLP_ENDPOINT")
                || env_set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))
    }

    /// Problems of `gateway.tracing`, each naming its key.
    pub fn problems(&self) -> Vec<String> {
        let at = "gateway.tracing";
        let mut out = Vec::new();
        if let Some(url) = &self.otlp_endpoint {
            let scheme_ok = url.starts_with("http://") || url.starts_with("https://");
            if !scheme_ok || url.parse::<http::Uri>().is_err() {
                out.push(format!(
                    "{at}.otlp_endpoint: '{url}' is not an http:// or https:// URL"
                ));
            }
        }
        if !(0.0..=1.0).contains(&self.sample_ratio) {
            out.push(format!(
                "{at}.sample_ratio: {} is outside 0.0..=1.0",
                self.sample_ratio
            ));
        }
        if self.service_name.trim().is_empty() {
            out.push(format!("{at}.service_name: empty"));
        }
        for name in self.headers.keys() {
            if http::HeaderName::from_bytes(name.as_bytes()).is_err() {
                out.push(format!("{at}.headers: '{name}' is not a header name"));
            }
        }
        if !(1..=1_000_000).contains(&self.queue_size) {
            out.push(format!(
                "{at}.queue_size: {} is outside 1..=1000000",
                self.queue_size
            ));
        }
        let ms = drg_base::infra::units::ms(self.export_timeout);
        if !(100..=60_000).contains(&ms) {
            out.push(format!(
                "{at}.export_timeout_ms: {ms} is outside 100..=60000"
            ));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn off_by_default_and_bad_values_are_named() {
        let c = TracingConfig::default();
        assert!(c.problems().is_empty());
        let bad: TracingConfig = serde_yaml::from_str(
            "{ otlp_endpoint: 'grpc://x', sample_ratio: 1.5, service_name: ' ', headers: { 'a b': x }, queue_size: 0, export_timeout_ms: 1 }",
        )
        .unwrap();
        let p = bad.problems().join("\n");
        for needle in [
            "otlp_endpoint",
            "sample_ratio",
            "service_name",
            "'a b'",
            "queue_size",
            "export_timeout_ms",
        ] {
            assert!(p.contains(needle), "{needle}: {p}");
        }
        assert!(serde_yaml::from_str::<TracingConfig>("{ endpoint: x }").is_err());
    }
}
