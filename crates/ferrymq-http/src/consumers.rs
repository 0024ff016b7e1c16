//! The consumers HTTP clients receive messages through, kept between requests so that what they
//! were given stays theirs to ack until it times out.

#[derive(Default)]
pub struct Registry {}
