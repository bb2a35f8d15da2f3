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

    /// Sends the signals of `change` (`signals(for:)`), from the bus thread; never waits.
    public func announce(_ change: Change) {
        bus.perform { [self] in
            do {
                for signal in Self.signals(for: change) {
                    let message = try bus.signal(path, signal.interface, signal.member)
                    try signal.fill(message)
                    try bus.send(message)
                }
            } catch {
                bus.logger.warning("D-Bus: a signal could not be sent: \(error)")
            }
        }
    }

    /// A signal to send from the object: its interface and member, and what appends its
    /// arguments.
    struct Signal {
        let interface: String
        let member: String
        let fill: (BusMessage) throws -> Void
    }

    /// The signals that say `change`, in the order they are sent: for a lock or an
    /// unlock, its signal and then PropertiesChanged of Locked.
    static func signals(for change: Change) -> [Signal] {
        switch change {
        case .willLock(let reason, let grace, let deadline):
            return [Signal(interface: Self.interface, member: "WillLock") { signal in
                try signal.append(reason)
                try signal.append(grace)
                try signal.append(Self.microseconds(deadline))
            }]
        case .locked(let reason):
            return [Signal(interface: Self.interface, member: "Locked") { try $0.append(reason) }, lockedChanged(true)]
        case .unlocked:
            return [Signal(interface: Self.interface, member: "Unlocked") { _ in }, lockedChanged(false)]
        }
    }

    /// `date` in microseconds since the epoch, as logind's timestamps (0 before it).
    static func microseconds(_ date: Date) -> UInt64 {
        UInt64(max(0, date.timeIntervalSince1970) * 1_000_000)
    }

    private static func lockedChanged(_ locked: Bool) -> Signal {
        Signal(interface: "org.freedesktop.DBus.Properties", member: "PropertiesChanged") { signal in
            try signal.append(Self.interface)
            try signal.open("a", "{sv}")
            try Self.appendEntry(signal, "Locked") { try $0.open("v", "b"); try $0.append(locked); try $0.close() }
            try signal.close()
            try signal.open("a", "s")
            try signal.close()
        }
    }

    // MARK: Method calls (on the bus thread)

    /// What the object answers to a method call, decided from the call and the mount's
    /// state alone (so a test needs no bus); `handle` carries it out.
    enum Answer {
        /// A reply, made and ready to send.
        case reply(BusMessage)
        /// A D-Bus error: its name and text.
        case error(String, String)
        /// `Lock(grace)`, once the caller is found to be the owner or root.
        case lock(grace: Bool)
        /// Not the object's to answer: sd-bus does (an unknown method).
        case unknown
    }

    private func handle(_ message: BusMessage) -> Int32 {
        do {
            switch try Self.answer(message, mountpoint: mountpoint, vault: vault, isLocked: control.isLocked) {
            case .reply(let reply):
                try bus.send(reply)
            case .error(let name, let text):
                return message.replyError(name, text)
            case .unknown:
                return 0
            case .lock(let grace):
                let uid = try bus.senderUID(of: message)
                guard Self.mayLock(uid, owner: owner) else {
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
            }
            return 1
        } catch {
            return message.replyError("org.freedesktop.DBus.Error.InvalidArgs", "\(error)")
        }
    }

    /// The answer to method call `message` to the object of a mount on `mountpoint`
    /// of `vault`, locked as `isLocked` says; throws on arguments it cannot read.
    static func answer(_ message: BusMessage, mountpoint: String, vault: String, isLocked: () -> Bool) throws -> Answer {
        switch (message.interface, message.member) {
        case ("org.freedesktop.DBus.Introspectable", "Introspect"):
            let reply = try message.methodReturn()
            try reply.append(Self.introspection)
            return .reply(reply)
        case ("org.freedesktop.DBus.Properties", "Get"):
            let interface = try message.readString(), property = try message.readString()
            guard interface == Self.interface, Self.properties.contains(property) else {
                return .error("org.freedesktop.DBus.Error.UnknownProperty", "no property \(interface).\(property)")
            }
            let reply = try message.methodReturn()
            try appendValue(reply, of: property, mountpoint: mountpoint, vault: vault, isLocked: isLocked)
            return .reply(reply)
        case ("org.freedesktop.DBus.Properties", "GetAll"):
            let interface = try message.readString()
            let reply = try message.methodReturn()
            try reply.open("a", "{sv}")
            if interface == Self.interface {
                for property in Self.properties {
                    try appendEntry(reply, property) { try appendValue($0, of: property, mountpoint: mountpoint, vault: vault, isLocked: isLocked) }
                }
            }
            try reply.close()
            return .reply(reply)
        case ("org.freedesktop.DBus.Properties", "Set"):
            return .error("org.freedesktop.DBus.Error.PropertyReadOnly", "the properties of \(Self.interface) are read-only")
        case (Self.interface, "Lock"):
            return .lock(grace: try message.readBool())
        default:
            return .unknown
        }
    }

    /// Whether uid `uid` may call Lock on the mount of `owner`: the owner and root only.
    static func mayLock(_ uid: uid_t, owner: uid_t) -> Bool {
        uid == owner || uid == 0
    }

    static let properties = ["Locked", "Mountpoint", "Vault"]

    private static func appendValue(_ message: BusMessage, of property: String, mountpoint: String, vault: String,
                                    isLocked: () -> Bool) throws {
        switch property {
        case "Locked":
            try message.open("v", "b"); try message.append(isLocked()); try message.close()
        case "Mountpoint":
            try message.open("v", "s"); try message.append(mountpoint); try message.close()
        default:
            try message.open("v", "s"); try message.append(vault); try message.close()
        }
    }

    private static func appendEntry(_ message: BusMessage, _ key: String, _ value: (BusMessage) throws -> Void) throws {
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
