// sd-bus from libsystemd, for Swift: the D-Bus client and object calls CofferBus makes
// (the session bus for the mount's object, the system bus for logind).
// Nothing else belongs here.
#include <systemd/sd-bus.h>
