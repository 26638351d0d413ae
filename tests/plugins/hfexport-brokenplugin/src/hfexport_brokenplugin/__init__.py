raise ImportError("hfexport-brokenplugin is broken on purpose: its toolchain module vendor_sdk is missing")
