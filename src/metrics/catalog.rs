//! Registration of every metric, with the description the metrics reference page is generated
//! from (`docs/reference/metrics.md`, checked by `tests/reference.rs`).

use prometheus::{
    GaugeVec, HistogramOpts, HistogramVec, IntCounterVec, IntGaugeVec, Opts, Registry,
};

/// Seconds: 1 ms to 60 s.
const LATENCY_BUCKETS: &[f64] = &[
    0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];

/// What a metric is, for its reference entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetricInfo {
    /// The reference page's section the metric is listed under.
    pub section: &'static str,
    pub name: &'static str,
    /// `counter`, `gauge` or `histogram` (Prometheus metric types).
    pub kind: &'static str,
    pub labels: &'static [&'static str],
    /// The HELP text served on `/metrics`.
    pub help: &'static str,
}

/// Registers metrics in one [`Registry`] and keeps their descriptions, by section.
pub(super) struct Registrar {
    pub registry: Registry,
    section: &'static str,
    pub catalog: Vec<MetricInfo>,
}

impl Registrar {
    pub fn new() -> Self {
        Registrar {
            registry: Registry::new(),
            section: "Other",
            catalog: Vec::new(),
        }
    }

    /// The metrics registered from now on are listed under `section`.
    pub fn section(&mut self, section: &'static str) {
        self.section = section;
    }

    fn register<C: prometheus::core::Collector + Clone + 'static>(
        &mut self,
        metric: C,
        kind: &'static str,
        name: &'static str,
        help: &'static str,
        labels: &'static [&'static str],
    ) -> C {
        self.registry
            .register(Box::new(metric.clone()))
            .expect("metric registered once");
        self.catalog.push(MetricInfo {
            section: self.section,
            name,
            kind,
            labels,
            help,
        });
        metric
    }

    pub fn counter(
        &mut self,
        name: &'static str,
        help: &'static str,
        labels: &'static [&'static str],
    ) -> IntCounterVec {
        let metric = IntCounterVec::new(Opts::new(name, help), labels).expect("valid metric");
        self.register(metric, "counter", name, help, labels)
    }

    /// An integer gauge labelled by pipeline only.
    pub fn gauge(&mut self, name: &'static str, help: &'static str) -> IntGaugeVec {
        self.labelled_gauge(name, help, &["pipeline"])
    }

    pub fn labelled_gauge(
        &mut self,
        name: &'static str,
        help: &'static str,
        labels: &'static [&'static str],
    ) -> IntGaugeVec {
        let metric = IntGaugeVec::new(Opts::new(name, help), labels).expect("valid metric");
        self.register(metric, "gauge", name, help, labels)
    }

    /// A gauge of fractional values (seconds).
    pub fn float_gauge(
        &mut self,
        name: &'static str,
        help: &'static str,
        labels: &'static [&'static str],
    ) -> GaugeVec {
        let metric = GaugeVec::new(Opts::new(name, help), labels).expect("valid metric");
        self.register(metric, "gauge", name, help, labels)
    }

    /// A histogram of seconds, 1 ms to 60 s.
    pub fn histogram(
        &mut self,
        name: &'static str,
        help: &'static str,
        labels: &'static [&'static str],
    ) -> HistogramVec {
        let metric = HistogramVec::new(
            HistogramOpts::new(name, help).buckets(LATENCY_BUCKETS.to_vec()),
            labels,
        )
        .expect("valid metric");
        self.register(metric, "histogram", name, help, labels)
    }
}

/// The tables of `docs/reference/metrics.md`: one per section, a row per metric in the order
/// registered.
pub fn reference_markdown(catalog: &[MetricInfo]) -> String {
    let mut out = String::new();
    let mut section = None;
    for metric in catalog {
        if section != Some(metric.section) {
            section = Some(metric.section);
            if !out.is_empty() {
                out.push('\n');
            }
            out.push_str(&format!(
                "### {}\n\n| metric | type | labels | meaning |\n|---|---|---|---|\n",
                metric.section
            ));
        }
        out.push_str(&format!(
            "| `{}` | {} | {} | {} |\n",
            metric.name,
            metric.kind,
            metric.labels.join(", "),
            metric.help.replace('|', "\\|")
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reference_groups_metrics_by_section_in_registration_order() {
        let mut r = Registrar::new();
        r.section("Delivery");
        r.counter("outbox_relay_a_total", "A | B.", &["pipeline"]);
        r.gauge("outbox_relay_b", "B.");
        r.section("Process");
        r.labelled_gauge("outbox_relay_c", "C.", &["version", "commit"]);
        assert_eq!(
            reference_markdown(&r.catalog),
            "### Delivery\n\n| metric | type | labels | meaning |\n|---|---|---|---|\n\
             | `outbox_relay_a_total` | counter | pipeline | A \\| B. |\n\
             | `outbox_relay_b` | gauge | pipeline | B. |\n\
             \n### Process\n\n| metric | type | labels | meaning |\n|---|---|---|---|\n\
             | `outbox_relay_c` | gauge | version, commit | C. |\n"
        );
    }
}
