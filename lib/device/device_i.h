/*
 * device_i.h - private: the emulated device's ops (dev_emu.c) for
 * device.c, which also finds the CUDA ones.
 */
#ifndef KVP_DEVICE_I_H
#define KVP_DEVICE_I_H

#include "lib/device/device.h"

extern const struct kvp_dev_ops kvp_dev_emu_ops;
/* Set the order of an emulated device's handle. */
void kvp_dev_emu_set_order(void *dev, enum kvp_emu_order o);

#endif /* KVP_DEVICE_I_H */
