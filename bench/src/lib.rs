//! Shared fixtures for the criterion benches.
