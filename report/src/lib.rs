//! gabp-report: self-contained HTML reports (no network, no external fonts or scripts) with
//! charts drawn by `plotters`' SVG backend and inlined as `<svg>`, shared by `gabp-relay report`
//! and `gabp-loadgen --report`.
//!
//! - [`chart`]: the chart kinds (lines over time with marks, latency percentile curves).
//! - [`page`]: the page (summary, tables, charts), every string escaped, and the tiny inline
//!   script that checks each chart rendered and marks the page `data-check="ok"`.
//! - [`check`]: reads a page's DOM as a browser dumped it and says whether every chart rendered.
//! - [`browser`]: runs a headless Chromium on a page file (tests use it).

pub mod browser;
pub mod chart;
pub mod check;
pub mod page;

pub use chart::{ChartError, Series, TimeMark};
pub use page::{escape, Page};
