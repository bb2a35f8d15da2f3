// Version is coffer's release version, in one place: `coffer --version` prints it, and the
// Debian package carries it (scripts/package refuses to build when debian/changelog's
// newest entry names another).

/// The release version: MAJOR.MINOR.PATCH, also the Debian package's version (a native
/// package, so no Debian revision).
let cofferVersion = "0.1.0"
