//! Install manifests (filled below).
