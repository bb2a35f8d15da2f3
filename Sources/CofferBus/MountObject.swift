// MountObject is a mount's object on its owner's session bus (docs/CONTROL.md, "D-Bus"):
// the well-known name io.github.coffer.Mount.<id>, the object /io/github/coffer/Mount/<id>
// with interface io.github.coffer.Mount1 — the property Locked, the signals WillLock,
// Locked and Unlocked, and the method Lock, which only the owner and root may call.
import CofferSystem
import Foundation
import Glibc
import Logging

public final class MountObject: Sendable {
    public static let interface = "io.github.coffer.Mount1"
    public static let namePrefix = "io.github.coffer.Mount."
    public static let pathPrefix = "/io/github/coffer/Mount/"

    /// What happened, as the signals say it.
    public enum Change: Sendable {
        /// A lock is coming, for `reason`, at `deadline` (`grace` seconds from now).
        case willLock(reason: String, grace: Double, deadline: Date)
        case locked(reason: String)
        case unlocked
    }

    /// What the object needs from the daemon: its state, and a lock (which may take
    /// seconds: it is called on a thread of its own, never the bus's).
    public struct Control: Sendable {
        public var isLocked: @Sendable () -> Bool
        public var lock: @Sendable (_ grace: Bool) -> Void

        public init(isLocked: @escaping @Sendable () -> Bool, lock: @escaping @Sendable (_ grace: Bool) -> Void) {
            self.isLocked = isLocked
            self.lock = lock
        }
    }

    public let bus: Bus
    /// The bus name and object path.
    public let name: String
    public let path: String
    private let mountpoint: String
    private let vault: String
    private let owner: uid_t
    private let control: Control

    /// The element that names a mount: `id`, a name already made of letters, digits and
    /// `_` (the control socket's, see the command), with `_` put first if a digit starts it.
    public static func element(_ id: String) -> String {
        let safe = String(id.unicodeScalars.map { $0.isASCII && (CharacterSet.alphanumerics.contains($0) || $0 == "_") ? Character($0) : "_" })
        return safe.first?.isNumber ?? true ? "_" + safe : safe
    }

    /// Exports the object on `bus` and takes its name; throws if either fails (the name
    /// taken by another daemon of the same mountpoint, a bus that refuses names).
    public init(bus: Bus, id: String, mountpoint: String, vault: String, owner: uid_t, control: Control) throws {
        self.bus = bus
        name = Self.namePrefix + Self.element(id)
        path = Self.pathPrefix + Self.element(id)
        self.mountpoint = mountpoint
        self.vault = vault
        self.owner = owner
        self.control = control
        try bus.addObject(path) { [self] message in handle(message) }
        try bus.requestName(name)
    }

    /// Sends the signal of `change` (and, for a lock or an unlock, PropertiesChanged of
    /// Locked), from the bus thread; never waits.
    public func announce(_ change: Change) {
        bus.perform { [self] in
            do {
                switch change {
                case .willLock(let reason, let grace, let deadline):
                    let signal = try bus.signal(path, Self.interface, "WillLock")
                    try signal.append(reason)
                    try signal.append(grace)
                    try signal.append(UInt64(max(0, deadline.timeIntervalSince1970) * 1_000_000))
                    try bus.send(signal)
                case .locked(let reason):
                    let signal = try bus.signal(path, Self.interface, "Locked")
                    try signal.append(reason)
                    try bus.send(signal)
                    try sendLockedChanged(true)
                case .unlocked:
                    try bus.send(try bus.signal(path, Self.interface, "Unlocked"))
                    try sendLockedChanged(false)
                }
            } catch {
                bus.logger.warning("D-Bus: a signal could not be sent: \(error)")
            }
        }
    }

    private func sendLockedChanged(_ locked: Bool) throws {
        let signal = try bus.signal(path, "org.freedesktop.DBus.Properties", "PropertiesChanged")
        try signal.append(Self.interface)
        try signal.open("a", "{sv}")
        try appendEntry(signal, "Locked") { try $0.open("v", "b"); try $0.append(locked); try $0.close() }
        try signal.close()
        try signal.open("a", "s")
        try signal.close()
        try bus.send(signal)
    }

    // MARK: Method calls (on the bus thread)

    private func handle(_ message: BusMessage) -> Int32 {
        do {
            switch (message.interface, message.member) {
            case ("org.freedesktop.DBus.Introspectable", "Introspect"):
                let reply = try message.methodReturn()
                try reply.append(Self.introspection)
                try bus.send(reply)
            case ("org.freedesktop.DBus.Properties", "Get"):
                let interface = try message.readString(), property = try message.readString()
                guard interface == Self.interface, Self.properties.contains(property) else {
                    return message.replyError("org.freedesktop.DBus.Error.UnknownProperty", "no property \(interface).\(property)")
                }
                let reply = try message.methodReturn()
                try appendValue(reply, of: property)
                try bus.send(reply)
            case ("org.freedesktop.DBus.Properties", "GetAll"):
                let interface = try message.readString()
                let reply = try message.methodReturn()
                try reply.open("a", "{sv}")
                if interface == Self.interface {
                    for property in Self.properties { try appendEntry(reply, property) { try appendValue($0, of: property) } }
                }
                try reply.close()
                try bus.send(reply)
            case ("org.freedesktop.DBus.Properties", "Set"):
                return message.replyError("org.freedesktop.DBus.Error.PropertyReadOnly", "the properties of \(Self.interface) are read-only")
            case (Self.interface, "Lock"):
                let grace = try message.readBool()
                let uid = try bus.senderUID(of: message)
                guard uid == owner || uid == 0 else {
                    bus.logger.warning("D-Bus: Lock refused to uid \(uid) (the mount is uid \(owner)'s)")
                    return message.replyError("org.freedesktop.DBus.Error.AccessDenied", "only the mount's owner and root may lock it")
                }
                // The lock waits (a drain, a grace): on a thread of its own, the reply after it.
                let lock = control.lock
                let token = bus.hold(message)
                BackgroundThread.start("coffer-bus-lock") { [bus] in
                    lock(grace)
                    bus.perform {
                        do {
                            if let call = bus.release(token) { try bus.send(try call.methodReturn()) }
                        } catch {
                            bus.logger.warning("D-Bus: Lock's reply could not be sent: \(error)")
                        }
                    }
                }
            default:
                return 0
            }
            return 1
        } catch {
            return message.replyError("org.freedesktop.DBus.Error.InvalidArgs", "\(error)")
        }
    }

    private static let properties = ["Locked", "Mountpoint", "Vault"]

    private func appendValue(_ message: BusMessage, of property: String) throws {
        switch property {
        case "Locked":
            try message.open("v", "b"); try message.append(control.isLocked()); try message.close()
        case "Mountpoint":
            try message.open("v", "s"); try message.append(mountpoint); try message.close()
        default:
            try message.open("v", "s"); try message.append(vault); try message.close()
        }
    }

    private func appendEntry(_ message: BusMessage, _ key: String, _ value: (BusMessage) throws -> Void) throws {
        try message.open("e", "sv")
        try message.append(key)
        try value(message)
        try message.close()
    }

    static let introspection = """
        <!DOCTYPE node PUBLIC "-//freedesktop//DTD D-BUS Object Introspection 1.0//EN"
         "http://www.freedesktop.org/standards/dbus/1.0/introspect.dtd">
        <node>
         <interface name="io.github.coffer.Mount1">
          <method name="Lock">
           <arg name="grace" type="b" direction="in"/>
          </method>
          <signal name="WillLock">
           <arg name="reason" type="s"/>
           <arg name="graceSeconds" type="d"/>
           <arg name="deadline" type="t"/>
          </signal>
          <signal name="Locked">
           <arg name="reason" type="s"/>
          </signal>
          <signal name="Unlocked"/>
          <property name="Locked" type="b" access="read">
           <annotation name="org.freedesktop.DBus.Property.EmitsChangedSignal" value="true"/>
          </property>
          <property name="Mountpoint" type="s" access="read">
           <annotation name="org.freedesktop.DBus.Property.EmitsChangedSignal" value="const"/>
          </property>
          <property name="Vault" type="s" access="read">
           <annotation name="org.freedesktop.DBus.Property.EmitsChangedSignal" value="const"/>
          </property>
         </interface>
         <interface name="org.freedesktop.DBus.Properties">
          <method name="Get">
           <arg name="interface_name" type="s" direction="in"/>
           <arg name="property_name" type="s" direction="in"/>
           <arg name="value" type="v" direction="out"/>
          </method>
          <method name="GetAll">
           <arg name="interface_name" type="s" direction="in"/>
           <arg name="props" type="a{sv}" direction="out"/>
          </method>
          <method name="Set">
           <arg name="interface_name" type="s" direction="in"/>
           <arg name="property_name" type="s" direction="in"/>
           <arg name="value" type="v" direction="in"/>
          </method>
          <signal name="PropertiesChanged">
           <arg type="s" name="interface_name"/>
           <arg type="a{sv}" name="changed_properties"/>
           <arg type="as" name="invalidated_properties"/>
          </signal>
         </interface>
         <interface name="org.freedesktop.DBus.Introspectable">
          <method name="Introspect">
           <arg name="xml_data" type="s" direction="out"/>
          </method>
         </interface>
         <interface name="org.freedesktop.DBus.Peer">
          <method name="Ping"/>
          <method name="GetMachineId">
           <arg type="s" name="machine_uuid" direction="out"/>
          </method>
         </interface>
        </node>

        """
}
