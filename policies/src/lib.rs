//! Pure placement policies and the trace simulator (under construction).
