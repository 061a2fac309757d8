/* R17: a consumer that reads a tensor from data and ignores byte_offset
 * (torch before 2.13). */
#ifndef CAPSAN_TORCH_OFFSET_H
#define CAPSAN_TORCH_OFFSET_H

/* The code at ret (a consume's return address) belongs to a torch that
 * ignores byte_offset: 1, else 0 (not torch, or one that honors it). */
int cs_consumer_ignores_offset(const void *ret);

#endif
