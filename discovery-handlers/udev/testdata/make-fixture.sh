#!/bin/sh
# Builds testdata/machine, a small fixture machine (sysfs tree and udev
# database) that the matcher tests read through NewSysfsDevice. The tree is
# committed; this script documents it and rebuilds it.
set -eu
cd "$(dirname "$0")"
rm -rf machine
R=machine
dev() { # dev DEVPATH SUBSYSTEM-LINK [DRIVER-LINK] ; uevent from stdin
	mkdir -p "$R/sys$1"
	cat >"$R/sys$1/uevent"
	ln -s "$2" "$R/sys$1/subsystem"
	if [ -n "${3:-}" ]; then ln -s "$3" "$R/sys$1/driver"; fi
}
attr() { printf '%s\n' "$3" >"$R/sys$1/$2"; }
db() { mkdir -p "$R/run/udev/data"; cat >"$R/run/udev/data/$1"; }

dev /devices/virtual/mem/null ../../../../class/mem <<U
MAJOR=1
MINOR=3
DEVNAME=null
DEVMODE=0666
U
dev /devices/virtual/mem/zero ../../../../class/mem <<U
MAJOR=1
MINOR=5
DEVNAME=zero
DEVMODE=0666
U

P=/devices/pci0000:00
mkdir -p "$R/sys$P"; : >"$R/sys$P/uevent"
dev $P/0000:00:14.0 ../../../bus/pci ../../../bus/pci/drivers/xhci_hcd <<U
DRIVER=xhci_hcd
PCI_ID=8086:A36D
U
attr $P/0000:00:14.0 vendor 0x8086
U1=$P/0000:00:14.0/usb1
dev $U1 ../../../../bus/usb ../../../../bus/usb/drivers/usb <<U
MAJOR=189
MINOR=0
DEVNAME=bus/usb/001/001
DEVTYPE=usb_device
DRIVER=usb
U
attr $U1 idVendor 1d6b

# An FTDI serial adapter: usb device, interface, usb-serial port, tty.
F=$U1/1-1
dev $F ../../../../../bus/usb ../../../../../bus/usb/drivers/usb <<U
MAJOR=189
MINOR=1
DEVNAME=bus/usb/001/002
DEVTYPE=usb_device
DRIVER=usb
U
attr $F idVendor 0403
attr $F idProduct 6001
attr $F serial "A1B2C3  "
attr $F manufacturer FTDI
dev $F/1-1:1.0 ../../../../../../bus/usb ../../../../../../bus/usb/drivers/ftdi_sio <<U
DEVTYPE=usb_interface
DRIVER=ftdi_sio
U
attr $F/1-1:1.0 bInterfaceNumber 00
dev $F/1-1:1.0/ttyUSB0 ../../../../../../../bus/usb-serial ../../../../../../../bus/usb-serial/drivers/ftdi_sio <<U
DRIVER=ftdi_sio
U
dev $F/1-1:1.0/ttyUSB0/tty/ttyUSB0 ../../../../../../../../../class/tty <<U
MAJOR=188
MINOR=0
DEVNAME=ttyUSB0
U
db c188:0 <<U
E:ID_VENDOR_ID=0403
E:ID_MODEL_ID=6001
E:ID_SERIAL=FTDI_FT232R_USB_UART_A1B2C3
E:ID_PATH=pci-0000:00:14.0-usb-0:1:1.0
G:systemd
U

# A webcam with two video nodes.
C=$U1/1-2
dev $C ../../../../../bus/usb ../../../../../bus/usb/drivers/usb <<U
MAJOR=189
MINOR=2
DEVNAME=bus/usb/001/003
DEVTYPE=usb_device
DRIVER=usb
U
attr $C idVendor 046d
attr $C idProduct 0825
dev $C/1-2:1.0 ../../../../../../bus/usb ../../../../../../bus/usb/drivers/uvcvideo <<U
DEVTYPE=usb_interface
DRIVER=uvcvideo
U
for i in 0 1; do
	dev $C/1-2:1.0/video4linux/video$i ../../../../../../../../class/video4linux <<U
MAJOR=81
MINOR=$i
DEVNAME=video$i
U
	attr $C/1-2:1.0/video4linux/video$i index $i
	attr $C/1-2:1.0/video4linux/video$i name "HD Webcam C270"
	db c81:$i <<U
E:ID_VENDOR_ID=046d
E:ID_MODEL_ID=0825
E:ID_V4L_CAPABILITIES=$([ $i = 0 ] && echo :capture: || echo :)
G:uaccess
G:seat
U
done

# A loop disk with a labelled file system, and network interfaces.
dev /devices/virtual/block/loop0 ../../../../class/block <<U
MAJOR=7
MINOR=0
DEVNAME=loop0
DEVTYPE=disk
U
attr /devices/virtual/block/loop0 size 16384
db b7:0 <<U
E:ID_FS_LABEL=dowse-data
E:ID_FS_UUID=0b4b3f0e-4b3c-4bd6-a1b6-2f6c4a1a9c11
E:ID_FS_TYPE=ext4
G:systemd
U
for n in veth0:5 tap0:6; do
	name=${n%:*} idx=${n#*:}
	dev /devices/virtual/net/$name ../../../../class/net <<U
INTERFACE=$name
IFINDEX=$idx
U
	attr /devices/virtual/net/$name type 1
done
attr /devices/virtual/net/tap0 tun_flags 0x1002
